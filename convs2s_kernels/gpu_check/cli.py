"""The command, ``python3 -m convs2s_kernels.gpu_check``: the modes of the package's docstring,
``--ci`` among them (the subset against a current report, or the stale modules' whole matrix)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional, Sequence

from ..triton_common.fits import KERNEL_MODULES, REPORT_PATH, row_violations
from .compile import run_jobs, tools_missing
from .jobs import DTYPES, TARGETS, build_jobs, subset_jobs, try_jobs
from .report import (STALE_MESSAGE, format_table, row_key, stale_modules, summarize, triton_version, unusable,
                     write_report)


def ci(report_path: Path, n_jobs: int, modules: Sequence[str], dtypes: Sequence[str] = DTYPES,
       targets: Sequence[str] = TARGETS) -> int:
    """CI: the subset against a current report, or the matrix of stale modules (and fail): the
    whole of it unless ``dtypes``/``targets`` narrow what is compiled to show."""
    report = json.loads(report_path.read_text()) if report_path.exists() else None
    stale = stale_modules(report, modules)
    status = 0
    if stale:
        why = ("no report at " + str(report_path) if report is None else
               f"the report was made with triton {report.get('triton')}, this is {triton_version()}"
               if report.get("triton") != triton_version() else
               "sources changed since the report: " + ", ".join(stale))
        print(f"{why}; compiling their whole matrix", file=sys.stderr)
        rows = run_jobs(build_jobs(stale, dtypes, targets), n_jobs)
        print(format_table(rows))
        print(summarize(rows))
        for line in unusable(rows):
            print(line)
        print(STALE_MESSAGE)
        status = 1
    current = [m for m in modules if m not in stale]
    if not current:
        return status
    assert report is not None
    # the report covers exactly today's configs, and every row in it keeps the rule
    expected = {job.key for job in build_jobs(current, DTYPES, TARGETS)}
    reported = {row_key(r): r for r in report["rows"] if r["kernel"].split("/")[0] in current}
    if set(reported) != expected:
        missing, extra = sorted(expected - set(reported)), sorted(set(reported) - expected)
        print(f"the report's rows do not match the configs: missing {missing[:5]}, extra {extra[:5]}; {STALE_MESSAGE}")
        return 1
    bad = unusable(list(reported.values()))
    if bad:
        print("the report leaves kernels without a usable config (fix or add configs):\n  " + "\n  ".join(bad))
        status = 1
    rows = run_jobs(subset_jobs(current), n_jobs)
    print(format_table(rows))
    for row in rows:
        ref = reported.get(row_key(row))
        if row.get("error") and not (ref or {}).get("error"):
            print(f"{' '.join(row_key(row))}: {row['error']}")
            status = 1
        elif ref is not None:
            diff = [f"{k} {row.get(k)} (report: {ref.get(k)})"
                    for k in ("shared", "registers", "spill_stores", "spill_loads", "mma") if row.get(k) != ref.get(k)]
            if diff:
                print(f"{' '.join(row_key(row))}: differs from the report: {', '.join(diff)}; {STALE_MESSAGE}")
                status = 1
    print(summarize(rows) + f"; {len(reported)} report rows checked")
    return status


def _parser() -> argparse.ArgumentParser:
    about = sys.modules[__package__].__doc__.split("\n\n")[0]
    parser = argparse.ArgumentParser(prog="python3 -m convs2s_kernels.gpu_check", description=about)
    parser.add_argument("--targets", default=",".join(TARGETS), help="comma-separated: sm_80,sm_90")
    parser.add_argument("--dtypes", default=",".join(DTYPES), help="comma-separated: " + ",".join(DTYPES))
    parser.add_argument("--kernels", default=",".join(KERNEL_MODULES),
                        help="comma-separated kernel modules: " + ",".join(KERNEL_MODULES))
    parser.add_argument("--report", default=str(REPORT_PATH), help="the report to write or check against")
    parser.add_argument("--write-report", action="store_true", help="compile the whole matrix and write the report")
    parser.add_argument("--ci", action="store_true", help="subset checked against a current report (see above)")
    parser.add_argument("--subset", action="store_true", help="compile the fixed subset only")
    parser.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1), help="compile processes")
    parser.add_argument("--json", help="also write the rows computed by this run to this file")
    parser.add_argument("--try", dest="candidates", action="append", default=[], metavar="LAUNCH:CONFIG",
                        help="compile a candidate config instead of the lists, e.g. "
                             "'conv_glu/_conv_glu_fwd_kernel:BLOCK_M=64,BLOCK_N=32,BLOCK_K=16,num_warps=4,num_stages=3' "
                             "(launch names as in the table, with the module; repeatable); exits 1 if one breaks the rule")
    return parser


def _run_candidates(specs: Sequence[str], dtypes: Sequence[str], targets: Sequence[str], n_jobs: int) -> int:
    rows = run_jobs(try_jobs(specs, dtypes, targets), n_jobs)
    print(format_table(rows))
    print(summarize(rows))
    return 1 if any(row_violations(r) for r in rows) else 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)

    missing = tools_missing()
    if missing:
        print(f"gpu_check cannot run: {missing}", file=sys.stderr)
        return 2
    # a fresh Triton cache: every compile is timed from scratch, ~/.triton is left alone
    cache = tempfile.TemporaryDirectory(prefix="gpu_check_cache_")
    os.environ["TRITON_CACHE_DIR"] = cache.name
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # Triton 3.9's default, without its warning

    def pick(text, allowed, what):
        items = [s.strip() for s in text.split(",") if s.strip()]
        bad = [s for s in items if s not in allowed]
        if bad:
            parser.error(f"unknown {what} {bad}; choose from {list(allowed)}")
        return items

    targets = pick(args.targets, TARGETS, "targets")
    dtypes = pick(args.dtypes, DTYPES, "dtypes")
    modules = pick(args.kernels, KERNEL_MODULES, "kernels")
    report_path = Path(args.report)
    t0 = time.perf_counter()
    if args.ci:
        status = ci(report_path, args.jobs, modules, dtypes, targets)
        print(f"gpu_check --ci: {time.perf_counter() - t0:.0f} s, {'ok' if status == 0 else 'FAILED'}")
        return status
    if args.write_report and (set(targets) != set(TARGETS) or set(dtypes) != set(DTYPES) or args.subset):
        parser.error("--write-report compiles the whole matrix: no --targets/--dtypes/--subset")
    if args.candidates:
        if args.write_report or args.subset:
            parser.error("--try checks candidates only: no --write-report/--subset")
        try:
            return _run_candidates(args.candidates, dtypes, targets, args.jobs)
        except ValueError as exc:
            parser.error(str(exc))
    jobs = subset_jobs(modules) if args.subset else build_jobs(modules, dtypes, targets)
    rows = run_jobs(jobs, args.jobs)
    seconds = time.perf_counter() - t0
    print(format_table(rows))
    print(summarize(rows) + f"; {seconds:.0f} s wall with {args.jobs} processes")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")
    if args.write_report:
        write_report(report_path, rows, modules, seconds, args.jobs)
        print(f"wrote {report_path}")
    bad = [] if args.subset else unusable(rows)
    for line in bad:
        print(line)
    return 1 if bad or any(r.get("error") for r in rows) else 0
