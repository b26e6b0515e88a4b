"""Helpers for the benchmark suites (kept out of conftest.py so tests and bench never clash)."""

import os

import torch

# CI sets this: every suite runs once at tiny shapes (with --benchmark-disable) as a smoke test.
SMOKE = os.environ.get("CONVS2S_BENCH_SMOKE") == "1"

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
if torch.cuda.is_available():  # fp16 is a GPU dtype (no CPU backend runs it fast)
    DTYPES["fp16"] = torch.float16


def shapes(paper, smoke):
    """The paper's shapes for real runs, tiny ones for the CI smoke run."""
    return smoke if SMOKE else paper


def record(benchmark, *, flops: float, bytes_moved: float, peaks: dict = None, dtype_name: str = None) -> None:
    """FLOPs, bytes, the achieved rates (from the median) and, with the session's measured peaks,
    the fractions of the GEMM peak and of the copy bandwidth, into the result's extra_info."""
    info = benchmark.extra_info
    info["flops"] = flops
    info["bytes"] = bytes_moved
    info["threads"] = torch.get_num_threads()
    if peaks:
        info.update(peaks)
    stats = getattr(benchmark, "stats", None)
    median = getattr(getattr(stats, "stats", None), "median", None) if stats is not None else None
    if median:
        info["gflops_per_s"] = flops / median / 1e9
        info["gb_per_s"] = bytes_moved / median / 1e9
        peak = (peaks or {}).get(f"gemm_gflops_{dtype_name}")
        if peak:
            info["fraction_of_gemm_peak"] = info["gflops_per_s"] / peak
        if (peaks or {}).get("copy_gbps"):
            info["fraction_of_copy_bandwidth"] = info["gb_per_s"] / peaks["copy_gbps"]


def run_timed(benchmark, fn, device: torch.device):
    """Warm up once outside the rounds, then time ``fn`` (synchronising the GPU every round)."""
    def call():
        out = fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return out

    call()
    return benchmark(call)
