"""``python3 -m convs2s_kernels.tune``: measure shapes (by default those this machine's cache
holds) and print the table of choices."""

from __future__ import annotations

import argparse
import sys
from typing import Dict, Optional, Sequence

import torch

from .. import tune, tune_cache
from ..extension import native, unavailable_reason
from .policy import ensure, forget
from .rules import entry_library, entry_timings, kernel_rows
from .shapes import ACTIVATION_BITS, Shape, parse_shape, twin_stream_mb


def _ranges(flags: Sequence[bool]) -> str:
    """``[T, T, F, T]`` -> ``"1-2, 4"`` (row counts, from 1)."""
    out, start = [], None
    for i, on in enumerate(list(flags) + [False], start=1):
        if on and start is None:
            start = i
        elif not on and start is not None:
            out.append(f"{start}" if start == i - 1 else f"{start}-{i - 1}")
            start = None
    return ", ".join(out) or "none"


def format_table(entries: Dict[str, dict]) -> str:
    cap = native().few_rows_max()
    lines = ["| shape | rows: kernel / GEMM (us) | rows on the few-row kernel | rows: ATen / oneDNN GEMM (us) |",
             "|---|---|---|---|"]
    for name, e in entries.items():
        cells = " ".join(f"{r}: {k:.0f}/{g:.0f}" for r, (k, g) in sorted(entry_timings(e).items()))
        library = entry_library(e)
        libs = "-" if library is None else " ".join(
            f"{r}: {b:.0f}/{d:.0f} ({'oneDNN' if d < b else 'ATen'})" for r, (b, d) in sorted(library.items()))
        lines.append(f"| {name} | {cells} | {_ranges(kernel_rows(entry_timings(e), cap))} | {libs} |")
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python3 -m convs2s_kernels.tune",
                                description=tune.__doc__.split("\n\n")[0])  # the package docstring's first paragraph
    p.add_argument("--shapes", default="", help="comma-separated form:dtype:KxN or form:KxN, each optionally "
                   "@<MB>MB (timed on weights as cold as in a step reading that many MB); default: the shapes "
                   "already in this machine's cache")
    p.add_argument("--dtype", default="", help="measure every shape also in these weight dtypes (float32,bfloat16,int8)")
    p.add_argument("--remeasure", action="store_true", help="measure even the shapes the cache has")
    args = p.parse_args(argv)
    if unavailable_reason() is not None:
        p.error(unavailable_reason())
    try:
        shapes = [parse_shape(s) for s in args.shapes.split(",") if s.strip()]
        if not shapes:
            shapes = [parse_shape(name) for name in tune_cache.load()]
        for dtype in (d.strip() for d in args.dtype.split(",") if d.strip()):
            # as cold as the shape it comes from (stream_mb kept): a weight timed hot chooses wrongly
            float_forms = [s for s in shapes if s.form not in ACTIVATION_BITS]  # w8a8 / w7a8: int8 already
            fits = [s for s in float_forms if not (dtype == "int8" and s.form in ("kn", "kp"))]
            skipped = [s.name for s in float_forms if s not in fits]
            if skipped:
                print(f"--dtype {dtype}: not for {', '.join(skipped)} (int8 weights are stored (N, K): form nk)",
                      file=sys.stderr)
            shapes += [Shape(s.form, dtype, s.K, s.N, twin_stream_mb(s, dtype)) for s in fits]
    except ValueError as exc:
        p.error(str(exc))
    if not shapes:
        p.error("no shapes: name some with --shapes (nothing is cached for this machine yet)")
    if args.remeasure:  # dropped from the file itself (save merges over what the file holds)
        tune_cache.save({}, drop=[s.name for s in dict.fromkeys(shapes)])
        forget()
    entries = ensure(shapes, measure_missing=True)
    print(f"few-row kernels ({native().small_gemm_isa()}, {torch.get_num_threads()} threads) against the GEMM "
          f"(ATen's or oneDNN's, whichever was faster); "
          f"cache: {tune_cache.cache_path()}")
    print(format_table(entries))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
