"""Pivot pytest-benchmark JSON files (one per machine or run) into one table: per benchmark group
(op, shape, dtype, mode) and machine, each backend's median time and its speedup over the
reference composition measured in the same run."""

from __future__ import annotations

import csv
import io
import json
from collections import defaultdict
from pathlib import Path
from typing import Dict, List, Sequence, Tuple

from convs2s.errors import Convs2sError

# The baseline of a group's speedups: the float32 product where the group has one (int8 weights
# are held against the fp32 model they replace, not against the int8 reference that dequantises
# on every call), else the reference composition.
BASELINES = ("fp32-weights", "reference")


class CompareError(Convs2sError):
    """A file that is no pytest-benchmark result, or results without a backend parameter."""


def machine_label(data: dict, path: Path) -> str:
    info = data.get("machine_info", {})
    if info.get("gpu_name"):
        return str(info["gpu_name"])
    cpu = info.get("cpu_model") or info.get("cpu", {}).get("brand_raw") or path.parent.name
    threads = info.get("torch_threads")
    return f"{cpu} ({threads} thr)" if threads else str(cpu)


def load(paths: Sequence[str]) -> Dict[Tuple[str, str], Dict[str, float]]:
    """(group, machine) -> {backend: median seconds}."""
    table: Dict[Tuple[str, str], Dict[str, float]] = defaultdict(dict)
    for p in map(Path, paths):
        try:
            data = json.loads(p.read_text(encoding="utf-8"))
            benches = data["benchmarks"]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise CompareError(f"{p} is not a pytest-benchmark JSON file: {exc}") from None
        label = machine_label(data, p)
        for b in benches:
            stats = b.get("stats") or {}
            backend = (b.get("params") or {}).get("backend") or (b.get("params") or {}).get("provider")
            if backend is None or stats.get("median") is None:
                continue
            table[(b.get("group") or b["name"], label)][backend] = float(stats["median"])
    if not table:
        raise CompareError("no benchmark results with a backend parameter in the given files")
    return table


def baseline_of(medians: Dict[str, float]) -> str:
    return next((b for b in BASELINES if b in medians), BASELINES[-1])


def rows(table) -> Tuple[List[str], List[List[str]]]:
    backends = sorted({b for v in table.values() for b in v}, key=lambda b: (b not in BASELINES, b))
    header = ["benchmark", "machine", "baseline"] + [f"{b} (ms)" for b in backends] + \
             [f"{b} speedup" for b in backends if b not in BASELINES]
    out = []
    for (group, machine), med in sorted(table.items()):
        baseline = baseline_of(med)
        line = [group, machine, baseline] + [f"{med[b] * 1e3:.3f}" if b in med else "" for b in backends]
        base = med.get(baseline)
        line += [f"{base / med[b]:.2f}x" if base and b in med else "" for b in backends if b not in BASELINES]
        out.append(line)
    return header, out


def to_markdown(header, body) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in body]
    return "\n".join(lines)


def to_csv(header, body) -> str:
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(header)
    w.writerows(body)
    return buf.getvalue()


def compare(paths: Sequence[str], fmt: str = "markdown") -> str:
    header, body = rows(load(paths))
    return to_markdown(header, body) if fmt == "markdown" else to_csv(header, body)
