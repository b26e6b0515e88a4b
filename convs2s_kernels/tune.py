"""Kernel choice by measurement: for each weight shape a decoding step multiplies, at which row
counts the few-row streaming kernels (``csrc/small_gemm.cpp``; for the decoder's convolutions,
and for the Linear weights of the one-call step, form ``kp``, the kernel on the weight packed by
``pack_conv_step_weight`` / ``pack_linear_weight``) beat the GEMM (ATen's or oneDNN's, below),
and for int8 weights times int8 activations (form ``w8a8``), at which the packed int8 kernel
(``csrc/linear_w8a8_cpu.cpp``, on the packed weight) beats the library's int8 GEMM (``_int_mm``,
where its sums are exact) or else the reducing int8 kernel; with 7-bit activations (form ``w7a8``)
the same, timed apart (the AVX2 packed kernel runs 7 bits faster, the reducing one does not).

"The GEMM" is itself a measured choice for float32 weights (``csrc/library_gemm.cpp``): ATen's
(a BLAS: MKL in torch's x86 builds, what the reference composition calls) or oneDNN's inner product,
timed against each other at ``LIBRARY_ROWS`` first; each row range takes the faster. The few-row
kernels are then timed against that one, and where it is oneDNN's, against ATen's too: a bucket's
GEMM is the faster of the two there, so a row count never runs a GEMM or kernel measured slower
than the reference's GEMM at its bucket. (MKL runs its AVX2 code on AMD CPUs, where oneDNN's took a
third of its time on a Zen 5; on other CPUs the BLAS may win.) Shapes alike in form, dtype, K and N
share one choice in the extension: within a process the first one measured or read holds (an
encoder's fc1 and an attention fold's product of its size see the same B x S rows; an encoder's
packed convolution and the decoding step's of its size, usually the encoder's, measured first,
differ only in how much weight streams between two calls, and both are measured colder than the
caches).

Both candidates are timed side by side, in alternating blocks of calls, at row buckets 1..64, on weights as cold as a
decoding step finds them: a step reads its whole weight set between two uses of one weight, so a
shape carries that set's size (``stream_mb``) and each call takes the next of enough copies to
fill it. (Timed on one weight kept hot in cache, the GEMM won from 8 rows on shapes where, in
the step, the kernels were 4-11% faster up to 16 rows.) Each bucket takes its winner, and a row
count between buckets takes the kernel only when both neighbours chose it, so the cpp backend
never runs a kernel measured slower than the GEMM the reference composition calls. Choices are
measured once per machine (:mod:`convs2s_kernels.tune_cache`) and handed to the extension, which
consults them on every call. :func:`ensure` is what the model calls before
decoding (measuring only what the cache lacks; ``CONVS2S_TUNE=0`` turns measuring off, and a
shape never measured takes the kernels up to 8 rows); ``python3 -m convs2s_kernels.tune``
prints the table::

    python3 -m convs2s_kernels.tune --shapes kn:1536x1024@512MB,nk:512x40000@512MB --dtype float32,int8
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import warnings
import time
from dataclasses import dataclass
from typing import Callable, Dict, Iterable, List, Optional, Sequence, Tuple

import torch
from tqdm import tqdm

from . import tune_cache
from .extension import native, unavailable_reason

ENV = "CONVS2S_TUNE"
ROW_BUCKETS = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64)
# Row counts at which the two GEMM libraries are timed against each other (a sentence or two of a
# decoding step's beams, a step's few dozen, an encoding's hundreds); each decides a row range
# (range_ends).
LIBRARY_ROWS = (16, 64, 256)
# (N, K) nn.Linear weights; (K, N) linearised conv weights; (N, K) int8 weights times int8 activations;
# (K, N) conv and Linear weights packed for the decoding step (pack_conv_step_weight, pack_linear_weight);
# form kp's GEMM side is timed on the (K, N) matrix (a Linear's fallback reads its (N, K) weight transposed)
FORMS = {"nk": 0, "kn": 1, "w8a8": 2, "kp": 3, "w7a8": 4}
# int8 weights times int8 activations, and the activations' bits of each such form
ACTIVATION_BITS = {"w8a8": 8, "w7a8": 7}
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "int8": torch.int8}
_applied: Dict[str, dict] = {}  # shape name -> entry handed to the extension in this process
_applied_keys: Dict[Tuple[str, str, int, int], str] = {}  # the extension's key -> the shape name in force for it
_unmeasured: set = set()  # shapes looked up and left at the default (measuring off), under _applied_key
_applied_key: Optional[dict] = None  # the machine key (threads, caps included) the choices above hold for


@dataclass(frozen=True)
class Shape:
    """One weight a decoding step multiplies: its layout, its dtype, ``K`` inputs, ``N`` outputs."""

    form: str
    dtype: str
    K: int
    N: int
    # megabytes of weights a decoding step reads between two uses of this one (its whole weight
    # set, a power of two: see stream_mb); 0 = this weight alone, hot in cache
    stream_mb: int = 0

    def __post_init__(self):
        if self.form not in FORMS:
            raise ValueError(f"form must be one of {', '.join(FORMS)}, got {self.form!r}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        if self.form in ("kn", "kp") and self.dtype == "int8":
            raise ValueError("int8 weights are stored (N, K): form nk")
        if self.form in ACTIVATION_BITS and self.dtype != "int8":
            raise ValueError(f"form {self.form} multiplies int8 weights, got {self.dtype}")
        if self.K < 1 or self.N < 1:
            raise ValueError(f"K and N must be positive, got {self.K}x{self.N}")
        if self.stream_mb < 0 or self.stream_mb & (self.stream_mb - 1):
            raise ValueError(f"stream_mb must be 0 or a power of two, got {self.stream_mb}")

    @property
    def name(self) -> str:
        base = f"{self.form}:{self.dtype}:{self.K}x{self.N}"
        return f"{base}@{self.stream_mb}MB" if self.stream_mb else base

    @property
    def weight_bytes(self) -> int:
        return self.K * self.N * DTYPES[self.dtype].itemsize


def stream_mb(weight_bytes: int) -> int:
    """A step's weight bytes as Shape.stream_mb: megabytes rounded up to a power of two (models of
    about one size share their measurements)."""
    mb = max(1, -(-weight_bytes // (1 << 20)))
    return 1 << (mb - 1).bit_length()


def twin_stream_mb(shape: Shape, dtype: str) -> int:
    """The stream of ``shape``'s twin in ``dtype``: the same weight set stored in ``dtype`` (an int8
    model streams a quarter of its float bytes), the size a decoder of that dtype asks for; 0 stays
    0 (timed hot)."""
    if not shape.stream_mb:
        return 0
    return stream_mb((shape.stream_mb << 20) * DTYPES[dtype].itemsize // DTYPES[shape.dtype].itemsize)


def _operands(shape: Shape, rows: int, gen: torch.Generator):
    dtype = DTYPES[shape.dtype]
    act = torch.float32 if dtype == torch.int8 else dtype
    x = torch.randn(rows, shape.K, generator=gen).to(act)
    bias = torch.randn(shape.N, generator=gen).to(act)
    if dtype == torch.int8:
        q = torch.randint(-127, 128, (shape.N, shape.K), dtype=torch.int8, generator=gen)
        return x, (q, torch.rand(shape.N, generator=gen) / 127), bias
    w = torch.randn(*((shape.N, shape.K) if shape.form == "nk" else (shape.K, shape.N)), generator=gen)
    return x, w.to(dtype), bias


def _cycle(items: list) -> Callable[[], object]:
    """A call that returns the next of ``items`` each time, round and round."""
    state = {"i": -1}

    def take():
        state["i"] = (state["i"] + 1) % len(items)
        return items[state["i"]]
    return take


def w8a8_has_choice() -> bool:
    """Whether int8 x int8 products have a choice to measure here: the packed int8 kernel (VNNI or
    AVX2) against the library's int8 GEMM where its sums are exact, else against the reducing
    kernel. Not with AMX (its kernel takes every call of 2 rows or more) nor on the baseline (one kernel)."""
    return unavailable_reason() is None and native().linear_w8a8_isa() in ("avx512-vnni", "avx2")


def _library_shape(shape: Shape) -> bool:
    """Whether the extension keeps a GEMM library choice for this shape: float32 weights in a float form."""
    return shape.dtype == "float32" and shape.form in ("nk", "kn", "kp")


def has_library_choice(shape: Shape) -> bool:
    """Whether this shape's GEMM side has two libraries to choose from: float32 weights in a float
    form, where this torch runs oneDNN's float32 inner product (and ``torch.backends.mkldnn`` is on)."""
    return (_library_shape(shape) and unavailable_reason() is None
            and torch.backends.mkldnn.enabled and native().onednn_gemm_available())


def range_ends(points: Sequence[int]) -> List[int]:
    """The row range each of the sorted row counts ``points`` decides: up to the geometric middle
    between it and the next, the last without end (-1)."""
    return [int((a * b) ** 0.5) for a, b in zip(points, points[1:])] + [-1]


def _weight_pool(shape: Shape, x_rows: int, seed: int):
    """``(x, pool, b)``: ``x_rows`` rows, and as many copies of the weight as fill ``stream_mb``."""
    x, w, b = _operands(shape, x_rows, torch.Generator().manual_seed(seed))
    copies = max(1, -(-(shape.stream_mb << 20) // shape.weight_bytes))
    pool = [w] + [tuple(t.clone() for t in w) if isinstance(w, tuple) else w.clone() for _ in range(copies - 1)]
    return x, pool, b


def library_candidates(shape: Shape, rows: int, seed: int = 0, operands=None
                       ) -> Tuple[Callable[[], object], Callable[[], object]]:
    """``(ATen's GEMM, oneDNN's)`` for ``rows`` rows of a float32 shape, on cold copies of the
    weight as :func:`candidates` (form kp: the (K, N) matrix, which the fallback multiplies).
    ``operands``: ``_weight_pool``'s, made once for several row counts (its first ``rows`` rows)."""
    C = native()
    x, pool, b = operands or _weight_pool(shape, rows, seed)
    x, take, nk = x[:rows], _cycle(pool), shape.form == "nk"
    return (lambda: C.gemm_with(x, take(), b, nk, "blas"), lambda: C.gemm_with(x, take(), b, nk, "onednn"))


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


def candidates(shape: Shape, rows: int, seed: int = 0, libraries: Sequence[str] = ("blas",)
               ) -> Tuple[Callable[[], object], ...]:
    """``(few-row kernel, GEMM, ...)`` for ``rows`` rows of this shape, each a no-argument call (a
    GEMM per name in ``libraries``: ``"blas"``, ATen's, or ``"onednn"``; w8a8 and w7a8: the packed
    int8 kernel on the packed weight, and its alternative: the library's int8 GEMM where its sums
    are exact, else the reducing kernel).
    With ``stream_mb``, each call (of any) multiplies the next of as many copies of the weight as
    fill it, so that every call reads a weight that the others pushed out of the caches, as in a step."""
    C = native()
    x, pool, b = _weight_pool(shape, rows, seed)
    if shape.form in ACTIVATION_BITS:  # the packed layout the decoder hands the kernels, made once per weight
        from .ops.linear_w8a8.reference import pack_w8a8_weight
        pool = [(q, s, pack_w8a8_weight(q)) for q, s in pool]
    if shape.form == "kp":  # the conv weight and the packed copy the decoding step reads
        pool = [(w, C.pack_kn_weight(w)) for w in pool]
    # one cycle for all: a GEMM must not read the copy the kernel has just brought into cache
    kernel_w = gemm_w = _cycle(pool)
    if shape.form in ACTIVATION_BITS:
        bits = ACTIVATION_BITS[shape.form]

        def w8a8(kernel: int) -> Callable[[], object]:
            def call():
                q, s, packed = kernel_w()
                return C.linear_w8a8_with(x, q, s, b, kernel, packed, bits)
            return call
        return w8a8(1), w8a8(C.linear_w8a8_alternative())
    if shape.dtype == "int8":
        # the GEMM side of an int8 weight: dequantise, then the float GEMM (what the extension does)
        def dequantised_gemm():
            q, s = gemm_w()
            return torch.addmm(b, x, (q.to(torch.float32) * s.unsqueeze(1)).t())
        return lambda: C.small_gemm_int8(x, *kernel_w(), b), dequantised_gemm
    nk = shape.form == "nk"
    matrix = (lambda: gemm_w()[0]) if shape.form == "kp" else gemm_w  # kp: the (K, N) matrix beside its packing

    def gemm(library: str) -> Callable[[], object]:
        return lambda: C.gemm_with(x, matrix(), b, nk, library)
    kernels = {"nk": lambda: C.small_gemm_nk(x, kernel_w(), b),
               "kn": lambda: C.small_gemm_kn(x, kernel_w(), b),
               "kp": lambda: C.small_gemm_kn_packed(x, kernel_w()[1], shape.N, b)}
    return (kernels[shape.form], *(gemm(lib) for lib in libraries))


def time_pair(fns: Sequence[Callable[[], object]], rounds: int = 3, per_block: int = 4,
              budget_s: float = 0.5, clock: Callable[[], float] = time.perf_counter) -> List[float]:
    """Median seconds of each function, timed in blocks: each round runs every function
    ``per_block`` times in a row after one untimed call, rounds alternating the functions so that
    clock and cache drift touch both alike; fewer rounds when calls are slow. In blocks, each
    call follows calls of its own kind, as in a step that runs one kind throughout: alternated
    call by call, a few-row kernel right after a cold GEMM ran 1.6-1.9x slower than after itself
    or after a pause (2 threads, Xeon), so that interleaving crowned the GEMM at 5-11 rows on
    shapes where, in the step, the kernel was twice as fast (bench/results/xeon-amx-2c).
    ``clock``: seconds, for tests."""
    samples: List[List[float]] = [[] for _ in fns]
    deadline = clock() + budget_s
    for i in range(rounds):
        for fn, out in zip(fns, samples):
            fn()  # the first call after the other function carries the switch
            for _ in range(per_block):
                t0 = clock()
                fn()
                out.append(clock() - t0)
        if i >= 1 and clock() > deadline:
            break
    return [statistics.median(s) for s in samples]


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


def stops_after_two_losses(shape: Shape) -> bool:
    """Whether measuring may stop once the kernel has lost at two buckets in a row: against a GEMM,
    whose lead only grows with the rows, yes. Not for w8a8 or w7a8 against the reducing int8 kernel (no
    exact library int8 GEMM): that one can lead at 1-2 rows and fall behind from a few more
    (3072 x 2048 on a Zen 3: the packed kernel lost at 1 and 2 rows and would have won 12-64 by
    1.3x; stopping there left every row count of the step's largest weights on the reducing kernel)."""
    return not (shape.form in ACTIVATION_BITS and not native().linear_w8a8_library_exact())


def measure_library(shape: Shape, rows_list: Iterable[int] = LIBRARY_ROWS) -> Dict[int, Tuple[float, float]]:
    """``{rows: (ATen's GEMM, oneDNN's) seconds}`` at each row count, in two short rounds (where
    one library wins, it wins by 1.3-3x: Zen 5, fconv_wmt_en_fr's shapes); a margin under 10% is
    timed again with the full rounds (one noisy sample must not decide)."""
    rows_list = list(rows_list)
    operands = _weight_pool(shape, max(rows_list), 0)  # one pool of cold copies for every row count
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
    stops = stops_after_two_losses(shape)
    library = measure_library(shape) if has_library_choice(shape) else None
    timings: Dict[int, Tuple[float, float]] = {}
    gemm_at: Dict[int, str] = {}  # each bucket's GEMM library
    losses = 0
    for rows in (r for r in buckets if r <= cap):
        # oneDNN's range: ATen's too, so that the bucket's GEMM is never slower than the reference's
        libs = ("onednn", "blas") if library_for(library, rows) == "onednn" else ("blas",)
        fns = candidates(shape, rows, libraries=libs)
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


def _key(shape: Shape) -> Tuple[str, str, int, int]:
    """What the extension keys a choice by: shapes alike in it share one."""
    return shape.form, shape.dtype, shape.K, shape.N


def apply(shape: Shape, entry: dict) -> None:
    C = native()
    C.set_few_rows_choice(FORMS[shape.form], shape.dtype, shape.K, shape.N,
                          kernel_rows(entry_timings(entry), C.few_rows_max()))
    if _library_shape(shape):  # an entry without a library: ATen's throughout
        C.set_gemm_library_choice(FORMS[shape.form], shape.dtype, shape.K, shape.N, *library_ranges(entry))
    _applied[shape.name] = entry
    _applied_keys[_key(shape)] = shape.name


def parse_shape(name: str) -> Shape:
    """``form:dtype:KxN[@<stream_mb>MB]`` (as :attr:`Shape.name` writes it) or ``form:KxN`` (float32)."""
    head, _, stream = name.partition("@")
    parts = head.split(":")
    try:
        form, dtype, dims = (parts[0], "float32", parts[1]) if len(parts) == 2 else parts
        K, N = (int(v) for v in dims.lower().split("x"))
        if stream and not stream.upper().endswith("MB"):
            raise ValueError(stream)
        mb = int(stream[:-2]) if stream else 0
    except ValueError:
        raise ValueError("a shape is form:dtype:KxN or form:KxN, optionally @<MB>MB (e.g. kn:float32:1536x1024@512MB), "
                         f"got {name!r}") from None
    return Shape(form, dtype, K, N, mb)


_measuring: Optional[bool] = None  # set by measuring(): overrides CONVS2S_TUNE while in force


def tuning_enabled() -> bool:
    if _measuring is not None:
        return _measuring
    return os.environ.get(ENV, "1").strip().lower() not in ("0", "off", "false", "no")


@contextlib.contextmanager
def measuring(enabled: bool):
    """Within it, missing shapes are measured (or, ``False``, left at the default) whatever
    CONVS2S_TUNE says: e.g. a trainer's validation, whose many-row products never take the few-row
    kernels and whose processes would all time kernels at once on shared cores."""
    global _measuring
    before, _measuring = _measuring, enabled
    try:
        yield
    finally:
        _measuring = before


def ensure(shapes: Iterable[Shape], *, measure_missing: Optional[bool] = None) -> Dict[str, dict]:
    """Hand the extension a choice for every shape: from this process, from the machine's cache, or
    measured now (and cached) unless measuring is off. Returns the entries in force. A new thread
    count or cap drops the choices in force first (they were measured for another machine key).
    A no-op without the extension (nothing runs the kernels then)."""
    if unavailable_reason() is not None:
        return {}
    global _applied_key
    # Shapes alike in (form, dtype, K, N) share the extension's one choice: the first measured or read holds.
    shapes = list(dict.fromkeys(shapes))
    key = tune_cache.machine_key()
    if key != _applied_key:  # another thread count (or cap): the choices in force do not hold
        forget()
        _applied_key = key
    measuring = tuning_enabled() if measure_missing is None else measure_missing
    missing = [s for s in shapes if _key(s) not in _applied_keys and (measuring or s.name not in _unmeasured)]
    if not missing:
        return _in_force(shapes)
    cached = tune_cache.load(key)
    todo = []
    for s in missing:
        if _key(s) in _applied_keys:  # an earlier shape of the list, alike in the extension's key
            continue
        if s.name in cached:
            apply(s, cached[s.name])
        else:
            todo.append(s)
    if todo and not measuring:
        _unmeasured.update(s.name for s in todo)
    elif todo:
        for s in tqdm(todo, desc="measuring few-row kernels vs GEMM (once per machine)", unit="shape",
                      disable=not sys.stderr.isatty(), leave=False):
            if _key(s) in _applied_keys:
                continue
            cached[s.name] = measure(s)
            apply(s, cached[s.name])
        try:
            tune_cache.save(cached, key)
        except OSError as exc:  # a read-only home: the choice still holds for this process
            warnings.warn(f"could not save the kernel choice to {tune_cache.cache_path(key)} ({exc}); "
                          f"it will be measured again next time (set {tune_cache.DIR_ENV} to a writable folder)")
    return _in_force(shapes)


def _in_force(shapes: Sequence[Shape]) -> Dict[str, dict]:
    """Each shape's entry in force: its own, or that of the shape alike in the extension's key."""
    return {s.name: _applied[_applied_keys[_key(s)]] for s in shapes if _key(s) in _applied_keys}


def forget() -> None:
    """Drop the limits handed to the extension in this process (the defaults apply again)."""
    native().clear_few_rows_choices()
    _applied.clear()
    _applied_keys.clear()
    _unmeasured.clear()


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
    p = argparse.ArgumentParser(prog="python3 -m convs2s_kernels.tune", description=__doc__.split("\n\n")[0])
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
