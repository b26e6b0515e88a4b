"""The rules that turn measured timings into choices, pure functions of the timings: which row
counts take the few-row kernel (:func:`kernel_rows`), and which GEMM library each row range takes
(:func:`library_for`, :func:`library_ranges`); and the reading of a cached entry's timings."""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

# Row counts at which the two GEMM libraries are timed against each other (a sentence or two of a
# decoding step's beams, a step's few dozen, an encoding's hundreds); each decides a row range
# (range_ends).
LIBRARY_ROWS = (16, 64, 256)


def range_ends(points: Sequence[int]) -> List[int]:
    """The row range each of the sorted row counts ``points`` decides: up to the geometric middle
    between it and the next, the last without end (-1)."""
    return [int((a * b) ** 0.5) for a, b in zip(points, points[1:])] + [-1]


def library_for(library: Optional[Dict[int, Tuple[float, float]]], rows: int) -> str:
    """The GEMM library measured faster for ``rows`` rows (``library``: ``{rows: (blas, onednn)}``
    at LIBRARY_ROWS), ``"blas"`` where nothing was measured."""
    if not library:
        return "blas"
    for end, at in zip(range_ends(LIBRARY_ROWS), LIBRARY_ROWS):
        if end == -1 or rows <= end:
            blas, onednn = library[at]
            return "onednn" if onednn < blas else "blas"
    return "blas"


def kernel_rows(timings: Dict[int, Tuple[float, float]], cap: int) -> List[bool]:
    """For each row count 1..``cap``: does the few-row kernel take it? A measured bucket takes
    its winner; a row count between two buckets takes the kernel only when both chose it; past
    the last bucket measured, the GEMM."""
    won = {rows: k <= g for rows, (k, g) in timings.items()}
    buckets = sorted(won)
    choice = []
    for rows in range(1, cap + 1):
        below = [b for b in buckets if b <= rows]
        above = [b for b in buckets if b >= rows]
        choice.append(bool(below and above and won[below[-1]] and won[above[0]]))
    return choice


def entry_timings(entry: dict) -> Dict[int, Tuple[float, float]]:
    """A measured entry's timings as ``{rows: (kernel µs, GEMM µs)}`` (the cache stores strings and lists)."""
    return {int(r): (float(k), float(g)) for r, (k, g) in entry["timings"].items()}


def entry_library(entry: dict) -> Optional[Dict[int, Tuple[float, float]]]:
    """A measured entry's GEMM library timings as ``{rows: (ATen µs, oneDNN µs)}``, or None."""
    lib = entry.get("library")
    return None if lib is None else {int(r): (float(b), float(d)) for r, (b, d) in lib.items()}


def library_ranges(entry: dict) -> Tuple[List[int], List[bool]]:
    """``(max_rows, onednn)`` row ranges for the extension (the last ``max_rows`` -1: no end): each
    row count where the libraries were compared (the few-row buckets' GEMMs, then LIBRARY_ROWS
    past them) decides up to the geometric middle between it and the next. Without a library
    entry: ATen's for every row count."""
    library = entry_library(entry)
    if library is None or sorted(library) != list(LIBRARY_ROWS):
        return [-1], [False]
    decided = {at: library_for(library, at) == "onednn" for at in LIBRARY_ROWS}
    decided.update({int(r): lib == "onednn" for r, lib in entry.get("gemm_at", {}).items()})
    points = sorted(decided)
    max_rows, onednn = [], []
    for end, at in zip(range_ends(points), points):  # adjacent ranges alike merge
        if onednn and onednn[-1] == decided[at]:
            max_rows[-1] = end
        else:
            max_rows.append(end)
            onednn.append(decided[at])
    return max_rows, onednn
