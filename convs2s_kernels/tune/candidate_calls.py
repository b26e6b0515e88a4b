"""The calls the kernel choice times against each other, for one shape and row count: the few-row
kernel and the GEMM (ATen's or oneDNN's) or, for int8 x int8 forms, the packed int8 kernel and its
alternative; each on as many copies of the weight as fill the shape's ``stream_mb``, so that every
call reads a weight as cold as a decoding step finds it. And whether this machine has a choice to
measure at all (:func:`has_library_choice`, :func:`w8a8_has_choice`)."""

from __future__ import annotations

from typing import Callable, Sequence, Tuple

import torch

from ..extension import native, unavailable_reason
from ..huge_pages import on_huge_pages
from .shapes import ACTIVATION_BITS, DTYPES, Shape, library_shape


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


def has_library_choice(shape: Shape) -> bool:
    """Whether this shape's GEMM side has two libraries to choose from: float32 weights in a float
    form, where this torch runs oneDNN's float32 inner product (and ``torch.backends.mkldnn`` is on)."""
    return (library_shape(shape) and unavailable_reason() is None
            and torch.backends.mkldnn.enabled and native().onednn_gemm_available())


def weight_pool(shape: Shape, x_rows: int, seed: int):
    """``(x, pool, b)``: ``x_rows`` rows, and as many copies of the weight as fill ``stream_mb``,
    each in the layout the calls read: form kp ``(matrix, packed)``, w8a8 and w7a8 ``(q, scale,
    packed)``, int8 ``(q, scale)``, else the matrix. Made once per shape and shared by every row
    count (slices of ``x``) and both timings (libraries, kernel): building the copies, not timing
    them, was nine tenths of a measurement (bench/results/kernel-decisions.md#tune-one-pool)."""
    x, w, b = _operands(shape, x_rows, torch.Generator().manual_seed(seed))
    if shape.form in ACTIVATION_BITS:  # the packed layout the decoder hands the kernels
        from ..ops.linear_w8a8.reference import pack_w8a8_weight
        w = (*w, pack_w8a8_weight(w[0]))
    elif shape.form == "kp":  # the conv weight and the packed copy the decoding step reads
        w = (w, native().pack_kn_weight(w))
    copies = max(1, -(-(shape.stream_mb << 20) // shape.weight_bytes))
    if copies == 1:
        return x, [w], b
    pool = list(zip(*(_copies(t, copies) for t in w))) if isinstance(w, tuple) else _copies(w, copies)
    return x, pool, b


def _copies(t: torch.Tensor, n: int):
    """``n`` copies of ``t``, one after the other in one allocation on huge pages where the
    extension makes them (as the decoding step's weights: convs2s_kernels.huge_pages): one
    allocation faults its pages in far less time than ``n`` clones."""
    many = t.unsqueeze(0).expand(n, *t.shape)
    moved = on_huge_pages(many)
    return list((many.contiguous() if moved is many else moved).unbind(0))  # left where it was: still n copies


def _matrix(shape: Shape, entry):
    """The matrix a GEMM multiplies from a pool entry (form kp: the (K, N) matrix beside its packing)."""
    return entry[0] if shape.form == "kp" else entry


def library_candidates(shape: Shape, rows: int, seed: int = 0, operands=None
                       ) -> Tuple[Callable[[], object], Callable[[], object]]:
    """``(ATen's GEMM, oneDNN's)`` for ``rows`` rows of a float32 shape, on cold copies of the
    weight as :func:`candidates` (form kp: the (K, N) matrix, which the fallback multiplies).
    ``operands``: :func:`weight_pool`'s, made once for several row counts (its first ``rows`` rows)."""
    C = native()
    x, pool, b = operands or weight_pool(shape, rows, seed)
    x, take, nk = x[:rows], _cycle(pool), shape.form == "nk"
    return (lambda: C.gemm_with(x, _matrix(shape, take()), b, nk, "blas"),
            lambda: C.gemm_with(x, _matrix(shape, take()), b, nk, "onednn"))


def candidates(shape: Shape, rows: int, seed: int = 0, libraries: Sequence[str] = ("blas",), operands=None
               ) -> Tuple[Callable[[], object], ...]:
    """``(few-row kernel, GEMM, ...)`` for ``rows`` rows of this shape, each a no-argument call (a
    GEMM per name in ``libraries``: ``"blas"``, ATen's, or ``"onednn"``; w8a8 and w7a8: the packed
    int8 kernel on the packed weight, and its alternative: the library's int8 GEMM where its sums
    are exact, else the reducing kernel).
    With ``stream_mb``, each call (of any) multiplies the next of as many copies of the weight as
    fill it, so that every call reads a weight that the others pushed out of the caches, as in a step.
    ``operands``: :func:`weight_pool`'s, made once for several row counts (its first ``rows`` rows)."""
    C = native()
    x, pool, b = operands or weight_pool(shape, rows, seed)
    x = x[:rows]
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

    def gemm(library: str) -> Callable[[], object]:
        return lambda: C.gemm_with(x, _matrix(shape, gemm_w()), b, nk, library)
    kernels = {"nk": lambda: C.small_gemm_nk(x, kernel_w(), b),
               "kn": lambda: C.small_gemm_kn(x, kernel_w(), b),
               "kp": lambda: C.small_gemm_kn_packed(x, kernel_w()[1], shape.N, b)}
    return (kernels[shape.form], *(gemm(lib) for lib in libraries))
