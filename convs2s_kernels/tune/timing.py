"""The timing harness: candidates timed side by side in alternating blocks of calls
(:func:`time_pair`), the GEMM libraries against each other (:func:`measure_library`), then the
few-row kernel against the faster GEMM at each row bucket (:func:`measure`), giving one shape's
cache entry."""

from __future__ import annotations

import statistics
import time
from typing import Callable, Dict, Iterable, List, Sequence, Tuple

from ..extension import native
from .candidate_calls import candidates, has_library_choice, library_candidates, weight_pool
from .rules import LIBRARY_ROWS, library_for
from .shapes import ACTIVATION_BITS, Shape

ROW_BUCKETS = (1, 2, 4, 8, 16, 32, 64)


def time_pair(fns: Sequence[Callable[[], object]], rounds: int = 3, per_block: int = 4,
              budget_s: float = 0.5, clock: Callable[[], float] = time.perf_counter) -> List[float]:
    """Median seconds of each function, timed in blocks: each round runs every function
    ``per_block`` times in a row after one untimed call, rounds alternating the functions so that
    clock and cache drift touch both alike; fewer rounds when calls are slow, and blocks of two
    from the first untimed call that says two rounds would overrun ``budget_s`` (a weight
    streamed from memory takes milliseconds a call, alike call after call: four samples of each
    decide as well as eight). In blocks, each call follows calls of its own kind, as in a step
    that runs one kind throughout: a kernel timed right after the other one's call runs slower
    than in a step (bench/results/kernel-decisions.md#tune-timing-in-blocks). ``clock``:
    seconds, for tests."""
    samples: List[List[float]] = [[] for _ in fns]
    deadline = clock() + budget_s
    for i in range(rounds):
        for fn, out in zip(fns, samples):
            t0 = clock()
            fn()  # the first call after the other function carries the switch
            if i == 0 and per_block > 2 and 2 * len(fns) * (per_block + 1) * (clock() - t0) > budget_s:
                per_block = 2
            for _ in range(per_block):
                t0 = clock()
                fn()
                out.append(clock() - t0)
        if i >= 1 and clock() > deadline:
            break
    return [statistics.median(s) for s in samples]


def stops_after_two_losses(shape: Shape) -> bool:
    """Whether measuring may stop once the kernel has lost at two buckets in a row: against a GEMM,
    whose lead only grows with the rows, yes. Not for w8a8 or w7a8 against the reducing int8 kernel (no
    exact library int8 GEMM): that one can lead at 1-2 rows and fall behind from a few more
    (bench/results/kernel-decisions.md#tune-w8a8-no-early-stop)."""
    return not (shape.form in ACTIVATION_BITS and not native().linear_w8a8_library_exact())


def measure_library(shape: Shape, rows_list: Iterable[int] = LIBRARY_ROWS, operands=None
                    ) -> Dict[int, Tuple[float, float]]:
    """``{rows: (ATen's GEMM, oneDNN's) seconds}`` at each row count, in two short rounds (where
    one library wins, it wins by a wide margin: bench/results/kernel-decisions.md#tune-library-rounds);
    a margin under 10% is timed again with the full rounds (one noisy sample must not decide).
    ``operands``: a :func:`weight_pool` with at least the largest row count's rows."""
    rows_list = list(rows_list)
    operands = operands or weight_pool(shape, max(rows_list), 0)  # one pool of cold copies for every row count
    out: Dict[int, Tuple[float, float]] = {}
    for rows in rows_list:
        fns = library_candidates(shape, rows, operands=operands)
        out[rows] = tuple(time_pair(fns, rounds=2, per_block=2, budget_s=0.2))
        if abs(out[rows][0] - out[rows][1]) < 0.1 * max(out[rows]):
            out[rows] = tuple(time_pair(fns, rounds=5, budget_s=1.0))
    return out


def measure(shape: Shape, buckets: Iterable[int] = ROW_BUCKETS) -> dict:
    """Time the GEMM libraries against each other where :func:`has_library_choice` (entry
    ``library``: microseconds, ATen's then oneDNN's, at LIBRARY_ROWS), then the few-row kernel
    against the faster GEMM at every bucket (up to the kernels' row cap), until the kernel has lost
    at two buckets in a row where :func:`stops_after_two_losses`; a loss is timed again with more
    rounds before it counts (one noisy sample must not decide). The entry's ``timings`` hold
    microseconds, kernel then GEMM."""
    cap = native().few_rows_max()
    buckets = [r for r in buckets if r <= cap]
    stops = stops_after_two_losses(shape)
    with_library = has_library_choice(shape)
    # one pool of cold copies for the libraries and every bucket (building it costs more than the timing)
    operands = weight_pool(shape, max([*buckets, *(LIBRARY_ROWS if with_library else ())], default=1), 0)
    library = measure_library(shape, operands=operands) if with_library else None
    timings: Dict[int, Tuple[float, float]] = {}
    gemm_at: Dict[int, str] = {}  # each bucket's GEMM library
    losses = 0
    for rows in buckets:
        # oneDNN's range: ATen's too, so that the bucket's GEMM is never slower than the reference's
        libs = ("onednn", "blas") if library_for(library, rows) == "onednn" else ("blas",)
        fns = candidates(shape, rows, libraries=libs, operands=operands)
        t = time_pair(fns)
        if t[0] > min(t[1:]):
            t = time_pair(fns, rounds=5, budget_s=1.0)
        best = min(range(len(libs)), key=lambda i: t[1 + i])
        timings[rows], gemm_at[rows] = (t[0], t[1 + best]), libs[best]
        losses = losses + 1 if timings[rows][0] > timings[rows][1] else 0
        if losses == 2 and stops:
            break
    entry = dict(timings={str(r): [round(t * 1e6, 2) for t in ts] for r, ts in timings.items()})
    if library is not None:
        entry["library"] = {str(r): [round(t * 1e6, 2) for t in ts] for r, ts in library.items()}
        entry["gemm_at"] = {str(r): lib for r, lib in gemm_at.items()}
    return entry
