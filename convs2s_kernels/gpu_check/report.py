"""The report of a run: the table and summary printed, the rule applied to rows, the committed
report written (one line per row) and its staleness (another Triton, or changed sources)."""

from __future__ import annotations

import datetime
import json
import os
import platform
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ..atomic_files import atomic_write_text
from ..triton_common.fits import (KERNEL_MODULES, MAX_COMPILE_S, SHARED_LIMITS, prune_configs, row_violations,
                                  source_hashes)

STALE_MESSAGE = "report is stale: run `python3 -m convs2s_kernels.gpu_check --write-report`"


def row_key(row: Dict[str, Any]) -> Tuple[str, str, str, str]:
    name = row["kernel"] + (f"[{row['site']}]" if row.get("site") else "")
    return (name, row["config"], row["dtype"], row["target"])


def unusable(rows: List[Dict[str, Any]]) -> List[str]:
    """(kernel, dtype, target) groups of ``rows`` left with no config that keeps the rule, as the
    autotuners' run-time pruning (:func:`~convs2s_kernels.triton_common.fits.prune_configs`,
    every call site of a kernel together) sees them."""
    groups: Dict[Tuple[str, str, str], List[str]] = {}
    for r in rows:
        names = groups.setdefault((r["kernel"], r["dtype"], r["target"]), [])
        if r["config"] not in names:
            names.append(r["config"])
    out = []
    for (kernel, dtype, target), names in groups.items():
        kept = prune_configs(names, kernel, dtype, target, None, {"rows": rows}, key=lambda c: c)
        if not kept or any(row_violations(r) for r in rows if r["kernel"] == kernel and r["dtype"] == dtype
                           and r["target"] == target and r["config"] == kept[0]):
            out.append(f"{kernel} {dtype} {target}: no config keeps the rule")
    return out


def format_table(rows: List[Dict[str, Any]]) -> str:
    head = ("kernel", "config", "dtype", "target", "regs", "stack", "spills st/ld", "shared", "mma", "compile s",
            "status")
    lines = []
    for r in rows:
        name = r["kernel"].split("/", 1)[1] + (f"[{r['site']}]" if r.get("site") else "")
        why = row_violations(r)
        status = "ok" if not why else "pruned: " + "; ".join(why)
        if r.get("error"):
            cells = (name, r["config"], r["dtype"], r["target"], "-", "-", "-", "-", "-",
                     f"{r.get('compile_s', 0):.1f}", status)
        else:
            cells = (name, r["config"], r["dtype"], r["target"], str(r.get("registers", "-")),
                     str(r.get("stack", "-")), f"{r['spill_stores']}/{r['spill_loads']}",
                     f"{r['shared'] / 1024:.0f} KB", r.get("mma", "?"), f"{r['compile_s']:.1f}", status)
        lines.append(cells)
    widths = [max(len(str(c)) for c in col) for col in zip(head, *lines)] if lines else [len(h) for h in head]
    fmt = lambda cells: "  ".join(str(c).ljust(w) for c, w in zip(cells, widths)).rstrip()
    return "\n".join([fmt(head), fmt(["-" * w for w in widths])] + [fmt(c) for c in lines])


def summarize(rows: List[Dict[str, Any]]) -> str:
    """One paragraph: how many compiles, kept and pruned (and why), the compile times."""
    why = [row_violations(r) for r in rows]
    pruned = sum(1 for w in why if w)
    causes = {"shared memory": 0, "spills": 0, "compile": 0, "compile failed": 0}
    for w in why:
        for cause in causes:
            if any(v.startswith(cause) for v in w):
                causes[cause] += 1
    secs = [r.get("compile_s", 0.0) for r in rows]
    text = (f"{len(rows)} compiles: {len(rows) - pruned} keep the rule (shared memory within "
            f"{', '.join(f'{t} {b} B' for t, b in SHARED_LIMITS.items())}, no spills, compile <= "
            f"{MAX_COMPILE_S:.0f} s), {pruned} pruned at run time"
            + (" (" + ", ".join(f"{c}: {n}" for c, n in causes.items() if n) + ")" if pruned else "")
            + f"; compile CPU time {sum(secs):.0f} s in all")
    if rows:
        worst = max(rows, key=lambda r: r.get("compile_s", 0.0))
        text += f", slowest {worst.get('compile_s', 0):.1f} s ({' '.join(row_key(worst))})"
    return text


def triton_version() -> str:
    import triton

    return triton.__version__


def write_report(path: Path, rows: List[Dict[str, Any]], modules: Sequence[str], seconds: float,
                 n_jobs: int) -> None:
    """Write the report; with only some modules, replace their rows and hashes in the existing one."""
    old: Dict[str, Any] = {}
    if path.exists() and set(modules) != set(KERNEL_MODULES):
        old = json.loads(path.read_text())
    hashes = source_hashes()
    kept_rows = [r for r in old.get("rows", []) if r["kernel"].split("/")[0] not in modules]
    report = dict(
        about=("Every Triton config of convs2s_kernels compiled for sm_80 and sm_90 on a CPU by "
               "`python3 -m convs2s_kernels.gpu_check --write-report`; the autotuners prune at run "
               "time by these rows (convs2s_kernels/triton_common/fits.py). compile_s is CPU seconds "
               "(ptxas included), wall_s the wall time with the other jobs running beside it; mma the "
               "tensor-core instructions in the SASS (HGMMA: Hopper's warp-group MMA, HMMA: mma.sync, "
               "-: none)."),
        triton=triton_version(),
        limits=dict(SHARED_LIMITS),
        max_compile_s=MAX_COMPILE_S,
        generated=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        machine=f"{platform.machine()}, {os.cpu_count()} CPUs, {n_jobs} compile processes",
        last_run=dict(modules=list(modules), compiles=len(rows), wall_s=round(seconds, 1),
                      compile_cpu_s=round(sum(r.get("compile_s", 0.0) for r in rows), 1)),
        sources={**old.get("sources", {}), **{m: hashes[m] for m in modules}},
        rows=sorted(kept_rows + rows, key=lambda r: (r["kernel"], r["site"], r["dtype"], r["target"], r["config"])),
    )
    atomic_write_text(path, dump_report(report))


def dump_report(report: Dict[str, Any]) -> str:
    """The report as JSON with one line per row (diffs stay readable)."""
    head = json.dumps({k: v for k, v in report.items() if k != "rows"}, indent=1)
    rows = ",\n".join("  " + json.dumps(r) for r in report["rows"])
    return head[:-2] + ',\n "rows": [\n' + rows + "\n ]\n}\n"


def stale_modules(report: Optional[Dict[str, Any]], modules: Sequence[str]) -> List[str]:
    """The ``modules`` whose rows ``report`` cannot vouch for: all of them without a report or with
    another Triton, else those whose sources changed since it."""
    if report is None:
        return list(modules)
    if report.get("triton") != triton_version():
        return list(modules)
    hashes = source_hashes()
    return [m for m in modules if report.get("sources", {}).get(m) != hashes[m]]
