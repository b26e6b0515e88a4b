"""The small tables the READMEs quote, made from the committed results (``bench/results/index.json``
names which speed-table JSON stands for each machine, and the setup commands' measured durations).

``python3 -m convs2s_bench.results_index`` prints both tables; ``--write`` puts them between their
markers in ``README.md`` and ``bench/results/README.md``; ``tests/test_results_index.py`` fails when
a README's table differs from what the data gives.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import Dict, List, Optional, Tuple

RESULTS = Path(__file__).resolve().parent.parent / "results"
REPO = RESULTS.parent.parent
MARKERS = {"main-job": ("<!-- main-job table:", "<!-- end of main-job table -->"),
           "durations": ("<!-- durations table:", "<!-- end of durations table -->"),
           "slowest-tests": ("<!-- slowest tests:", "<!-- end of slowest tests -->")}


def load_index(results: Path = RESULTS) -> dict:
    return json.loads((results / "index.json").read_text())


def _pair(rows: List[dict], want) -> Dict[int, dict]:
    return {r["beam"]: r for r in rows if want(r)}


def main_job_rows(index: dict, results: Path = RESULTS) -> List[Tuple[str, str, Dict[int, dict], Dict[int, dict]]]:
    """Per machine: its name, the date, the reference's rows and the fast row's by beam."""
    out = []
    for entry in index["main_job"]:
        rows = json.loads((results / entry["table"]).read_text())["rows"]
        for side in (True, False):
            configs = {_config(r) for r in rows if (r["backend"] == "reference") == side}
            if len(configs) != 1:
                raise ValueError(f"{entry['table']}: expected one {'reference' if side else 'fast'} configuration, "
                                 f"found {sorted(configs)}")
        ref = _pair(rows, lambda r: r["backend"] == "reference")
        fast = _pair(rows, lambda r: r["backend"] != "reference")
        out.append((entry["machine"], entry["measured"], ref, fast))
    return out


def _config(row: dict) -> str:
    return f"{row['backend']} {row['decoder']} {row['dtype']}"


def _secs(x: float) -> str:
    return f"{x:,.0f}"


def main_job_table(index: Optional[dict] = None, results: Path = RESULTS) -> str:
    index = index or load_index(results)
    lines = ["| machine | measured | reference row: seconds at beam 1 / 5 | fast row: seconds at beam 1 / 5 "
             "| speed-up, beam 1 / 5 |", "|---|---|---|---|---|"]
    for machine, date, ref, fast in main_job_rows(index, results):
        beams = sorted(set(ref) & set(fast))
        ref_s = " / ".join(_secs(ref[b]["seconds"]) for b in beams)
        fast_s = " / ".join(_secs(fast[b]["seconds"]) for b in beams)
        ratios = " / ".join(f"{ref[b]['seconds'] / fast[b]['seconds']:.2f}x" for b in beams)
        lines.append(f"| {machine} | {date} | {_config(ref[beams[0]])}: {ref_s} | {_config(fast[beams[0]])}: "
                     f"{fast_s} | {ratios} |")
    return "\n".join(lines)


def _minutes(run: Optional[dict]) -> str:
    return "-" if not run else f"{run['wall_s'] / 60:.1f}"


def recorded_cells(row: dict) -> Tuple[str, str, str, str]:
    """The install, main-job, test-suite and source cells of a row ``convs2s_bench.durations`` recorded."""
    first, second = row.get("main_job_first"), row.get("main_job_second")
    main_job = _minutes(second or first)
    if first and second:
        main_job += f" (first run {_minutes(first)})"
    elif first:
        main_job += " (first run)"
    tests = row.get("tests")
    tests_cell = _minutes(tests)
    if tests and "tests" in tests:
        t = tests["tests"]
        tests_cell += f" ({t['passed']:,} passed, {t['skipped']} skipped, {t['failed']} failed; " \
                      f"{tests['cpu_s'] / 60:.1f} CPU-min)"
    commits = sorted({r["commit"] for r in (row.get(k) for k in ("install", "main_job_first", "main_job_second",
                                                                   "tests")) if r})
    return _minutes(row.get("install")), main_job, tests_cell, f"recorded (`convs2s_bench.durations`) at {', '.join(commits)}"


def durations_table(index: Optional[dict] = None, results: Path = RESULTS) -> str:
    index = index or load_index(results)
    lines = ["| machine | measured | `install.sh` (min) | main job (min) | `test.sh` (min) | source |",
             "|---|---|---|---|---|---|"]
    for e in index["durations"]:
        lines.append(f"| {e['machine']} | {e['measured']} | {e['install_min']} | {e['main_job_min']} | "
                     f"{e['tests_min']} | {e['source']} |")
    for row in index.get("recorded", []):
        lines.append(f"| {row['machine']} | {row['measured']} | " + " | ".join(recorded_cells(row)) + " |")
    return "\n".join(lines)


def slowest_tests_table(index: Optional[dict] = None, results: Path = RESULTS) -> str:
    """The slowest tests of each machine's newest recorded test-suite run."""
    index = index or load_index(results)
    newest: Dict[str, dict] = {}
    for row in index.get("recorded", []):
        if row.get("tests", {}).get("tests"):
            newest[row["machine"]] = row
    lines = ["| machine | measured | test | seconds |", "|---|---|---|---|"]
    for machine, row in newest.items():
        for name, secs in row["tests"]["tests"]["slowest"]:
            lines.append(f"| {machine} | {row['measured']} | `{name}` | {secs:.1f} |")
    return "\n".join(lines)


def quoted(text: str, which: str) -> Optional[str]:
    """The table between ``which``'s markers in ``text`` (None without the markers)."""
    start, end = MARKERS[which]
    m = re.search(re.escape(start) + r"[^\n]*\n(.*?)" + re.escape(end), text, re.S)
    return None if m is None else m.group(1).rstrip("\n")


def replace_quoted(text: str, which: str, table: str) -> str:
    start, end = MARKERS[which]
    return re.sub("(" + re.escape(start) + r"[^\n]*\n)(.*?)(" + re.escape(end) + ")",
                  lambda m: m.group(1) + table + "\n" + m.group(3), text, flags=re.S)


TARGETS = {"main-job": (REPO / "README.md", main_job_table), "durations": (RESULTS / "README.md", durations_table),
           "slowest-tests": (RESULTS / "README.md", slowest_tests_table)}


def write_tables(index: Optional[dict] = None, show=None) -> None:
    """Put each table between its markers in its README (``show``: called with each table)."""
    index = index or load_index()
    for which, (path, make) in TARGETS.items():
        table = make(index)
        if show:
            show(table + "\n")
        text = path.read_text()
        if quoted(text, which) is None:
            raise SystemExit(f"{path} has no {which} markers")
        path.write_text(replace_quoted(text, which, table))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="update the tables in the READMEs")
    args = parser.parse_args(argv)
    index = load_index()
    if args.write:
        write_tables(index, show=print)
        return 0
    for _, make in TARGETS.values():
        print(make(index) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
