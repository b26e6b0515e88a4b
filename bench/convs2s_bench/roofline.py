"""The machine's own limits, measured: a large GEMM (peak FLOP/s per dtype) and a large copy
(memory bandwidth), so benchmark figures can be read as fractions of what the device can do."""

from __future__ import annotations

import time
from typing import Callable, Dict, Iterable, Optional, Tuple

import torch


def sync(device: torch.device) -> None:
    """Wait for the device's queued work (a timer around GPU work reads nothing otherwise)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _best_seconds(fn: Callable[[], object], device: torch.device, repeats: int) -> float:
    fn()  # warm-up: allocation, library dispatch, clocks
    sync(device)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        sync(device)
        best = min(best, time.perf_counter() - t0)
    return best


def gemm_peak_gflops(device="cpu", dtype=torch.float32, n: int = 2048, repeats: int = 5) -> float:
    """Best-of-``repeats`` GFLOP/s of an ``n^3`` matmul (fp32 accumulation for reduced precision);
    for fp32 on a CPU, the better of that and :func:`fma_peak_gflops`: MKL's fp32 GEMM runs its
    AVX2 code on AMD CPUs, so on an AVX-512 AMD EPYC (Zen 5) the library GEMM (237 GFLOP/s, 2
    threads) was below what the project's AVX-512 kernels ran a decoding step at (~300)."""
    device = torch.device(device)
    if device.type == "cpu" and dtype == torch.bfloat16 and not _native_bf16():
        # without bf16 dot products the kernels widen bf16 to fp32 (exact), so that is its limit;
        # ATen's bf16 GEMM there ran at 0.3 GFLOP/s (AMD EPYC Zen 3, AVX2): minutes at n = 2048
        return gemm_peak_gflops(device, torch.float32, n, repeats)
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    out = torch.empty(n, n, device=device, dtype=dtype)
    secs = _best_seconds(lambda: torch.mm(a, b, out=out), device, repeats)
    gemm = 2.0 * n ** 3 / secs / 1e9
    if device.type == "cpu" and dtype == torch.float32:
        return max(gemm, fma_peak_gflops(repeats=min(repeats, 3)) or 0.0)
    return gemm


def _native_bf16() -> bool:
    from convs2s_kernels.env import native_bf16

    return native_bf16() is not None


def fma_peak_gflops(repeats: int = 3, iters: int = 20_000_000) -> Optional[float]:
    """Best-of-``repeats`` GFLOP/s of register-only fp32 multiply-adds on every thread at the
    instruction set the project's kernels run at (``csrc/fma_peak.cpp``; ``CONVS2S_KERNELS_ISA``
    caps it): the FMA units' limit, no GEMM above it. None without the C++ extension."""
    from convs2s_kernels.extension import native, unavailable_reason

    if unavailable_reason() is not None:
        return None
    return max(native().fma_peak_gflops(iters) for _ in range(max(1, repeats)))


def int8_gemm_peak_gops(n: int = 2048, repeats: int = 5, activation_bits: int = 8, weight_bits: int = 8) -> float:
    """Best-of-``repeats`` GOP/s (2 per multiply-add) of exact int8 x int8 -> int32 products on the
    CPU: the best of an ``n^3`` product through the math library (``torch._int_mm``: oneDNN,
    AMX-INT8 or VNNI where it has them, within ``ONEDNN_MAX_CPU_ISA``), the project's own int8
    kernel (:func:`int8_kernel_peak_gops`) and the int8 dot products' register-only rate
    (:func:`int8_dot_peak_gops`). Without VNNI, ``_int_mm`` ran at 2 GOP/s (AMD EPYC Zen 3, AVX2)
    while the decoding step's int8 products ran near 100, so it was no limit of theirs; and a
    limit the kernel itself sets would hide how far below the instructions' rate it runs.
    ``activation_bits`` 7: the kernel and the dot products with 7-bit activations; ``weight_bits``
    7 with 7-bit weights too (the AVX2 kernel's paired groups)."""
    return int8_gemm_peaks_gops(n, repeats, ((activation_bits, weight_bits),))[(activation_bits, weight_bits)]


def int8_gemm_peaks_gops(n: int = 2048, repeats: int = 5,
                         widths: Iterable[Tuple[int, int]] = ((8, 8),)) -> Dict[Tuple[int, int], float]:
    """:func:`int8_gemm_peak_gops` for each ``(activation_bits, weight_bits)`` of ``widths``, the
    library's product (which quantises nothing: the same for every width) timed once."""
    own = {(a, w): max(int8_kernel_peak_gops(n, repeats=repeats, activation_bits=a, weight_bits=w) or 0.0,
                       int8_dot_peak_gops(repeats=min(repeats, 3), activation_bits=a, weight_bits=w) or 0.0)
           for a, w in widths}
    library = int8_library_gops(n, repeats, below=min(own.values()))
    return {k: max(library, v) for k, v in own.items()}


LIBRARY_PROBE, LIBRARY_HEADROOM = 256, 8.0


def int8_library_gops(n: int = 2048, repeats: int = 5, below: float = 0.0) -> float:
    """Best-of-``repeats`` GOP/s of the library's int8 GEMM (``torch._int_mm``) at ``n^3``; first
    probed at ``LIBRARY_PROBE^3``: a library that runs there ``LIBRARY_HEADROOM`` times below
    ``below`` (the project's own kernels' rate) cannot set the peak, and keeps its probe's rate
    (without VNNI or AMX ATen's int8 product ran at 1 GOP/s on a Zen 3: 100 s at 2048^3)."""
    device = torch.device("cpu")
    gen = torch.Generator().manual_seed(0)

    def rate(size: int, times: int) -> float:
        a = torch.randint(-127, 128, (size, size), dtype=torch.int8, generator=gen)
        b = torch.randint(-127, 128, (size, size), dtype=torch.int8, generator=gen)
        return 2.0 * size ** 3 / _best_seconds(lambda: torch._int_mm(a, b), device, times) / 1e9

    probe = rate(min(n, LIBRARY_PROBE), 2)
    if n <= LIBRARY_PROBE or probe * LIBRARY_HEADROOM < below:
        return probe
    return rate(n, repeats)


def int8_dot_peak_gops(repeats: int = 3, iters: int = 5_000_000, activation_bits: int = 8,
                       weight_bits: int = 8) -> Optional[float]:
    """Best-of-``repeats`` GOP/s of register-only exact int8 dot products on every thread, in the
    instructions the cpp ``linear_w8a8`` multiplies with (``csrc/fma_peak.cpp``: AVX-512 VNNI's
    vpdpbusd, or AVX2's vpsignb + vpmaddubsw + vpmaddwd + vpaddd; within ``CONVS2S_KERNELS_ISA``):
    the int8 counterpart of :func:`fma_peak_gflops`; ``activation_bits`` 7: AVX2's group without
    vpsignb, as the kernel runs it for 7-bit activations, and with ``weight_bits`` 7 too two groups'
    pairs added before one widening. None without the C++ extension or on the baseline (no SIMD
    dot product)."""
    from convs2s_kernels.extension import native, unavailable_reason

    if unavailable_reason() is not None:
        return None
    return max(native().int8_dot_peak_gops(iters, activation_bits, weight_bits) for _ in range(max(1, repeats))) or None


def int8_kernel_peak_gops(n: int = 2048, rows: int = 64, repeats: int = 5, activation_bits: int = 8,
                          weight_bits: int = 8) -> Optional[float]:
    """Best-of-``repeats`` GOP/s of the cpp ``linear_w8a8`` (activations quantised per row, the
    packed weight) at ``rows`` rows of a hot ``n x n`` weight: the most the kernels a decoding step
    calls reach here. None without the C++ extension."""
    product = _int8_kernel_product(n, rows, activation_bits, weight_bits)
    return None if product is None else _int8_product_gops(product, n, rows, repeats)


def _int8_product_gops(product: Callable[[], object], n: int, rows: int, repeats: int) -> float:
    """Best-of-``repeats`` GOP/s of ``product`` (:func:`_int8_kernel_product` of ``n`` and ``rows``)."""
    return 2.0 * rows * n * n / _best_seconds(product, torch.device("cpu"), repeats) / 1e9


def _int8_kernel_product(n: int, rows: int, activation_bits: int = 8,
                         weight_bits: int = 8) -> Optional[Callable[[], object]]:
    """The cpp ``linear_w8a8`` of ``rows`` rows times a packed ``n x n`` int8 weight (of
    ``weight_bits``), operands made once; None without the C++ extension."""
    import convs2s_kernels as ck
    from convs2s_kernels.extension import unavailable_reason

    if unavailable_reason() is not None:
        return None
    gen = torch.Generator().manual_seed(0)
    qmax = 2 ** (weight_bits - 1) - 1
    q = torch.randint(-qmax, qmax + 1, (n, n), dtype=torch.int8, generator=gen)
    scale = torch.rand(n, generator=gen) / qmax
    x = torch.randn(rows, n, generator=gen)
    packed = ck.pack_w8a8_weight(q)
    return lambda: ck.linear_w8a8(x, q, scale, packed=packed, activation_bits=activation_bits, weight_bits=weight_bits,
                                  backend="cpp")


def memory_buffer_megabytes(device="cpu") -> int:
    """A buffer size that measures memory, not cache: 256 MB, or twice the CPU's last-level cache
    where that is larger (some server CPUs have 0.5 GB of L3)."""
    from convs2s_kernels.env import last_level_cache_bytes

    if torch.device(device).type != "cpu":
        return 256
    return max(256, 2 * last_level_cache_bytes() // (1 << 20))


def read_probe_gbps(src: torch.Tensor, repeats: int = 1) -> float:
    """Best-of-``repeats`` GB/s of the extension's streaming read of ``src`` (``csrc/read_peak.cpp``:
    every thread its share, prefetching ahead as the int8 kernels do); 0 on other devices or
    without the extension. On a Zen 5 VM it read 50.7-51.0 GB/s where a copy read 40.7-42.3 and a
    sum 41.5-48.2 over the same 256 MB."""
    from convs2s_kernels.extension import native, unavailable_reason

    if src.device.type != "cpu" or unavailable_reason() is not None:
        return 0.0
    return max(native().read_peak_gbps(src) for _ in range(max(1, repeats)))


def copy_peak_gbps(device="cpu", megabytes: Optional[int] = None, repeats: int = 5) -> float:
    """Best-of-``repeats`` memory bandwidth in GB/s over ``megabytes`` (default:
    :func:`memory_buffer_megabytes`, the memory's; smaller sizes measure the caches a working set
    of that size lives in): the best of a tensor copy (bytes read + bytes written) and three
    read-only passes (the math library's matrix-vector product over the buffer, a sum, and the
    extension's prefetching read, :func:`read_probe_gbps`: MKL's matrix-vector product read 20-30
    GB/s on a Zen 5 where a sum read 87). Kernels that stream weights only read, and reading alone
    can outrun a copy, so a copy alone would be a limit they beat (the name stays: results files
    key on it)."""
    device = torch.device(device)
    return buffers_gbps(*_copy_buffers(megabytes or memory_buffer_megabytes(device), device), repeats)


def buffers_gbps(src: torch.Tensor, dst: torch.Tensor, repeats: int = 5) -> float:
    """:func:`copy_peak_gbps` over buffers the caller keeps (``_copy_buffers``), to sample again."""
    device = src.device
    n = src.numel()
    copy_secs = _best_seconds(lambda: dst.copy_(src), device, repeats)
    cols = 1024 if n % 1024 == 0 else 1
    matrix, vec = src.view(-1, cols), torch.randn(cols, device=device)
    read_secs = min(_best_seconds(lambda: torch.mv(matrix, vec), device, repeats),
                    _best_seconds(lambda: src.sum(), device, repeats))
    return max(_bandwidth_gbps(src, copy_secs, read_secs), read_probe_gbps(src, repeats))


def _copy_buffers(megabytes: int, device=torch.device("cpu")) -> Tuple[torch.Tensor, torch.Tensor]:
    """(source, destination) of ``megabytes`` each. On the CPU on huge pages, as the weights a
    decoding step streams are (convs2s_kernels.huge_pages): on 4 KB pages the same copy measured
    47 or 90 GB/s by process on a Zen 5 VM, a limit the step's huge-page reads then beat."""
    from convs2s_kernels.huge_pages import on_huge_pages

    src = on_huge_pages(torch.randn(max(megabytes * (1 << 20) // 4, 1024), device=device))
    return src, on_huge_pages(torch.empty_like(src))


def _bandwidth_gbps(src: torch.Tensor, copy_secs: float, read_secs: float) -> float:
    """GB/s: the better of a copy of ``src`` (bytes read + written) and a read-only pass over it."""
    nbytes = src.numel() * src.element_size()
    return max(2.0 * nbytes / copy_secs, nbytes / read_secs) / 1e9


class LimitSampler:
    """One quick sample of the machine's limits, to take beside each timed piece of work: a copy,
    a sum and the prefetching read (:func:`read_probe_gbps`) over buffers of ``megabytes`` (on huge pages, as :func:`copy_peak_gbps`), and the
    compute limit (fp32: the FMA units' register-only rate, about 10 ms; ``int8``: the better of
    the int8 dot products' register-only rate, :func:`int8_dot_peak_gops`, and the cpp
    ``linear_w8a8`` at 64 rows, :func:`int8_kernel_peak_gops`, which AMX can put above it). On a
    VM whose vCPUs change speed for seconds at a time (AMD EPYC Zen 3, 2 vCPUs), best-of limits
    measured once at the start and a median of steps taken minutes later need not see the same
    machine; a sample beside each step does. Without the C++ extension the compute limit is ``fallback_compute``."""

    _INT8_N, _INT8_ROWS = 2048, 64

    def __init__(self, megabytes: int, int8: bool = False, fallback_compute: Optional[float] = None,
                 activation_bits: int = 8, weight_bits: int = 8):
        self._src, self._dst = _copy_buffers(megabytes)
        # the int8 product's operands once, not per sample (a 4 MB weight drawn and packed each time)
        self._int8_product = (_int8_kernel_product(self._INT8_N, self._INT8_ROWS, activation_bits, weight_bits)
                              if int8 else None)
        self._int8, self._fallback, self._bits, self._weight_bits = int8, fallback_compute, activation_bits, weight_bits

    def _compute(self) -> Optional[float]:
        if not self._int8:
            return fma_peak_gflops(repeats=1, iters=5_000_000) or self._fallback
        if self._int8_product is None:
            return self._fallback
        kernel = _int8_product_gops(self._int8_product, self._INT8_N, self._INT8_ROWS, repeats=1)
        return max(kernel, int8_dot_peak_gops(repeats=1, iters=1_000_000, activation_bits=self._bits,
                                              weight_bits=self._weight_bits) or 0.0)

    def sample(self) -> Tuple[float, Optional[float]]:
        """(copy GB/s: the best of the copy, bytes read + written, the sum and the prefetching read,
        bytes read; compute GFLOP/s or GOP/s)."""
        t0 = time.perf_counter()
        self._dst.copy_(self._src)
        t1 = time.perf_counter()
        self._src.sum()
        t2 = time.perf_counter()
        memory = max(_bandwidth_gbps(self._src, t1 - t0, t2 - t1), read_probe_gbps(self._src))
        return memory, self._compute()


def measure_peaks(device="cpu", dtypes: Iterable[torch.dtype] = (torch.float32, torch.bfloat16),
                  small: bool = False, int8: bool = False, int7: bool = False, w7a7: bool = False) -> Dict[str, float]:
    """``{"gemm_gflops_fp32": ..., "gemm_gflops_bf16": ..., "copy_gbps": ...}``; ``small`` for smoke runs;
    ``int8`` adds ``gemm_gflops_int8`` (GOP/s of :func:`int8_gemm_peak_gops`, CPUs only), ``int7``
    ``gemm_gflops_int7`` (the same with 7-bit activations), ``w7a7`` ``gemm_gflops_w7a7`` (7-bit
    activations and weights)."""
    names = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16", torch.float64: "fp64"}
    n, mb, reps = (256, 8, 1) if small else (2048, None, 5)
    peaks = {f"gemm_gflops_{names[d]}": gemm_peak_gflops(device, d, n, reps) for d in dtypes}
    names_of = {(8, 8): "int8", (7, 8): "int7", (7, 7): "w7a7"}  # (activation, weight) bits -> gemm_gflops_<name>
    widths = [bits for bits, asked in zip(names_of, (int8, int7, w7a7)) if asked]
    if widths and torch.device(device).type == "cpu":
        peaks.update({f"gemm_gflops_{names_of[bits]}": gops for bits, gops in int8_gemm_peaks_gops(n, reps, widths).items()})
    peaks["copy_gbps"] = copy_peak_gbps(device, mb, reps)
    peaks["peak_threads"] = torch.get_num_threads()
    return peaks


class RooflineError(AssertionError):
    """A measured rate above the machine's measured limit: the FLOP or byte count is wrong, or the
    data never left the cache the limit was measured beyond."""


def fractions_of_peak(*, gflops_per_s: float, gb_per_s: float, gemm_gflops: Optional[float] = None,
                      copy_gbps: Optional[float] = None) -> Dict[str, float]:
    """``fraction_of_gemm_peak`` and ``fraction_of_copy_bandwidth`` of the achieved rates; a fraction
    above 1 raises :class:`RooflineError` (a bug in the accounting, never a result)."""
    out = {}
    for name, rate, peak in (("fraction_of_gemm_peak", gflops_per_s, gemm_gflops),
                             ("fraction_of_copy_bandwidth", gb_per_s, copy_gbps)):
        if peak:
            out[name] = rate / peak
            if out[name] > 1.0:
                raise RooflineError(f"{name} = {out[name]:.2f} > 1 ({rate:.1f} achieved against a measured "
                                    f"{peak:.1f}): the work or bytes are miscounted, or the data stayed in cache")
    return out
