"""How long the README's setup commands take here, recorded as data (issue 58): each command is run
and timed by this module, and its wall and CPU time land in ``bench/results/index.json`` under
this machine and today's date, with the test suite's counts and slowest tests read from its JUnit
reports, and the READMEs' tables are rendered again from it (``convs2s_bench.results_index``), so
that a rise shows in the next diff instead of in CI's time limit.

    python3 -m convs2s_bench.durations run install -- bash scripts/install.sh
    python3 -m convs2s_bench.durations run main-job -- python3 -m convs2s bench speed-table  # first, then second run
    python3 -m convs2s_bench.durations run tests -- bash scripts/test.sh

``main-job`` is recorded as the first run where this machine has no kernel choice cached yet (the
first run measures the kernel choice and the compute type), else as the second. The command's exit status is passed on; a
failed command is recorded as failed, never as a duration.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Dict, List, Optional

from convs2s_kernels.atomic_files import atomic_write_text
from convs2s_kernels.env import CAP_VARIABLES, cpuinfo_field

from .results_index import RESULTS, load_index, write_tables

WHATS = ("install", "main-job", "tests")
SLOWEST = 15  # tests listed per run


def machine_label(info: Optional[Dict[str, str]] = None, env=os.environ, cores: Optional[int] = None) -> str:
    """The machine as the durations table names it: "AMD EPYC Zen 3, AVX2 only (2 cores)"."""
    if info is None:
        info = {k: cpuinfo_field(k) or "" for k in ("vendor_id", "cpu family", "flags", "model name")}
    flags = set(info.get("flags", "").split())
    cores = cores or os.cpu_count() or 1
    vendor, family = info.get("vendor_id", ""), int(info.get("cpu family", "0") or 0)
    if vendor == "AuthenticAMD":
        zen = {25: "Zen 4" if "avx512f" in flags else "Zen 3", 26: "Zen 5"}.get(family, f"family {family}")
        name = f"AMD EPYC {zen}"
    elif vendor == "GenuineIntel":
        name = "Intel Xeon, AMX" if "amx_tile" in flags else "Intel Xeon"
    else:
        name = info.get("model name") or platform.processor() or "unknown CPU"
    capped = any(env.get(v, "").lower() == "avx2" for v in CAP_VARIABLES)
    if capped:
        name += ", capped at AVX2"
    elif "avx512f" not in flags and "avx2" in flags:
        name += ", AVX2 only"
    return f"{name} ({cores} cores)"


def read_junit(path: Path) -> Dict[str, object]:
    """Counts and the slowest tests of one JUnit report (pytest's ``--junitxml``)."""
    root = ET.parse(path).getroot()
    counts = dict(passed=0, failed=0, skipped=0)
    slow = []
    for case in root.iter("testcase"):
        kinds = {child.tag for child in case}
        if kinds & {"failure", "error"}:
            counts["failed"] += 1
        elif "skipped" in kinds:
            counts["skipped"] += 1
        else:
            counts["passed"] += 1
        name = f"{case.get('classname', '')}::{case.get('name')}"
        slow.append((round(float(case.get("time") or 0), 1), name))
    slow.sort(reverse=True)
    return dict(counts, slowest=[[name, secs] for secs, name in slow[:SLOWEST]])


def timed(command: List[str], env: Dict[str, str]) -> Dict[str, float]:
    """Run ``command``; its wall time, its CPU time (its processes' user + system) and exit status."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    rc = subprocess.call(command, env=env)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return dict(rc=rc, wall_s=round(wall, 1), cpu_s=round(cpu, 1))


def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=RESULTS, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "-"


def record(index: dict, what: str, result: Dict[str, object], machine: str, date: str,
           first: Optional[bool] = None) -> dict:
    """Merge one timed run into ``index``'s recorded rows (one row per machine and day) and return
    that row. ``main-job``: ``first`` says whether it ran with nothing measured yet on this machine
    (a new first run drops the row's second, which belonged to another first); None: the row's
    first ``main-job`` is the first run, the next the second."""
    rows = index.setdefault("recorded", [])
    row = next((r for r in rows if r["machine"] == machine and r["measured"] == date), None)
    if row is None:
        row = dict(machine=machine, measured=date)
        rows.append(row)
    key = what.replace("-", "_")
    if what == "main-job":
        if first is None:
            first = "main_job_first" not in row
        key = "main_job_first" if first else "main_job_second"
        if first:
            row.pop("main_job_second", None)
    row[key] = result
    return row


def first_main_job() -> bool:
    """Whether the main job would run with nothing measured here yet: no kernel choice cached for
    this machine key (what the first run spends its extra minutes measuring)."""
    from convs2s_kernels import tune_cache

    return not tune_cache.cache_path().exists()


def _save(index: dict) -> None:
    atomic_write_text(RESULTS / "index.json", json.dumps(index, indent=1) + "\n")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="action", required=True)
    run = sub.add_parser("run", help="run a setup command, timed, and record it")
    run.add_argument("what", choices=WHATS)
    run.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command")
    sub.add_parser("machine", help="print this machine's label")
    args = parser.parse_args(argv)
    if args.action == "machine":
        print(machine_label())
        return 0
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command to time after --")
    env = dict(os.environ)
    with tempfile.TemporaryDirectory(prefix="convs2s-durations-") as reports:
        if args.what == "tests":
            env["CONVS2S_TEST_REPORTS"] = reports  # scripts/test.sh writes its JUnit reports there
        first = first_main_job() if args.what == "main-job" else None
        result = timed(command, env)
        result["commit"] = _commit()
        for name in ("bench", "tests"):
            path = Path(reports) / f"{name}.xml"
            if path.exists():
                result[name] = read_junit(path)
    if result["rc"] != 0:
        print(f"durations: {' '.join(command)} exited with {result['rc']}; nothing recorded", file=sys.stderr)
        return int(result["rc"])
    index = load_index()
    row = record(index, args.what, result, machine_label(), datetime.date.today().isoformat(), first)
    _save(index)
    write_tables(index)  # the READMEs' tables stay what the data gives (tests/test_results_index.py)
    print(f"durations: {args.what} took {result['wall_s'] / 60:.1f} min wall, {result['cpu_s'] / 60:.1f} min CPU "
          f"on {row['machine']}; recorded in {RESULTS / 'index.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
