"""Helpers of the pytest-benchmark suites under ``bench/`` (``test_bench_*.py``): the smoke switch,
the dtypes, the shapes, timing and the roofline record of each case.

Imports nothing of ``convs2s_kernels`` at module level: ``bench/conftest.py`` imports this module
before the kernels, whose import reads ``TRITON_INTERPRET``."""

import os
from typing import Optional

import torch

# CI sets this: every suite runs once at tiny shapes (with --benchmark-disable) as a smoke test.
SMOKE = os.environ.get("CONVS2S_BENCH_SMOKE") == "1"

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
if torch.cuda.is_available():  # fp16 is a GPU dtype (no CPU backend runs it fast)
    DTYPES["fp16"] = torch.float16


def shapes(paper, smoke):
    """The paper's shapes for real runs, tiny ones for the CI smoke run."""
    return smoke if SMOKE else paper


_copy_at: dict = {}


def in_cache(working_set_bytes: int, device: torch.device) -> bool:
    """Whether a working set of this size stays in a CPU's last-level cache between rounds."""
    from convs2s_kernels.env import last_level_cache_bytes

    return device is not None and device.type == "cpu" and working_set_bytes < last_level_cache_bytes()


def copy_bandwidth_for(working_set_bytes: int, device: torch.device, peaks: dict) -> float:
    """The copy bandwidth a working set of this size sees: the memory's (``peaks``) when it exceeds
    the last-level cache, else a copy of that size measured once (the cache it fits in)."""
    from .roofline import copy_peak_gbps

    if not in_cache(working_set_bytes, device):
        return peaks["copy_gbps"]
    mb = max(1, 1 << max(0, (working_set_bytes >> 20).bit_length()))  # power-of-two MB bucket above it
    if mb not in _copy_at:
        _copy_at[mb] = copy_peak_gbps(device, mb)
    return _copy_at[mb]


_memory_buffers: list = []


def memory_bandwidth_sample(device: torch.device = None) -> Optional[float]:
    """The memory's bandwidth now (as :func:`roofline.copy_peak_gbps`, best of 3, over buffers made
    once per session), on a CPU; else None."""
    from .roofline import _copy_buffers, buffers_gbps, memory_buffer_megabytes

    if device is not None and device.type != "cpu":
        return None
    if not _memory_buffers:
        _memory_buffers.extend(_copy_buffers(memory_buffer_megabytes()))
    return buffers_gbps(*_memory_buffers, repeats=3)


def memory_bandwidth_beside(session_gbps: float, before_gbps: Optional[float] = None,
                            device: torch.device = None) -> float:
    """The memory's bandwidth as a case saw it: the best of the session's (measured at its start), a
    sample taken right before the case's rounds (:func:`run_timed`) and one taken now, right after.
    On a 2-vCPU VM the memory's speed moved between phases for seconds to minutes (a copy read 51.6
    GB/s in one process and 85.7 in another, 49.7-90.5 between the cases of one run), so a limit
    measured once let a case timed in a fast phase exceed it by 1.03-1.71x."""
    after = memory_bandwidth_sample(device)
    return max([session_gbps] + [g for g in (before_gbps, after) if g])


def record(benchmark, *, flops: float, bytes_moved: float, peaks: dict = None, dtype_name: str = None,
           working_set_bytes: int = None, device: torch.device = None) -> None:
    """FLOPs, bytes, the achieved rates (from the median) and, with the session's measured peaks,
    the fractions of the GEMM peak and of the copy bandwidth into the result's extra_info; a
    fraction above 1 fails the case (a miscount, never a result). ``working_set_bytes``: the
    bytes a round reuses (weights that stay resident between rounds); where they fit in the
    last-level cache the bandwidth limit is that cache's, measured at that size."""
    from .roofline import fractions_of_peak

    info = benchmark.extra_info
    info["flops"] = flops
    info["bytes"] = bytes_moved
    info["threads"] = torch.get_num_threads()
    if peaks:
        info.update(peaks)
    stats = getattr(benchmark, "stats", None)
    median = getattr(getattr(stats, "stats", None), "median", None) if stats is not None else None
    if median and peaks:
        info["gflops_per_s"] = flops / median / 1e9
        info["gb_per_s"] = bytes_moved / median / 1e9
        copy = peaks.get("copy_gbps")
        if copy and working_set_bytes is not None and in_cache(working_set_bytes, device):
            copy = info["copy_gbps_for_working_set"] = copy_bandwidth_for(working_set_bytes, device, peaks)
        elif copy:  # streamed from memory
            copy = info["copy_gbps_beside"] = memory_bandwidth_beside(copy, info.get("copy_gbps_before"), device)
        info.update(fractions_of_peak(gflops_per_s=info["gflops_per_s"], gb_per_s=info["gb_per_s"],
                                      gemm_gflops=peaks.get(f"gemm_gflops_{dtype_name}"), copy_gbps=copy))


def copies_to_stream(nbytes: int, device: torch.device) -> int:
    """How many copies of ``nbytes`` of weights fill eight times the last-level cache (at least two;
    at most 1 GB past 2x, server L3s reach 0.5 GB); one in the smoke run or off the CPU."""
    from convs2s_kernels.env import last_level_cache_bytes

    llc = last_level_cache_bytes()
    span = max(2 * llc, min(8 * llc, 1 << 30))
    return 1 if SMOKE or device.type != "cpu" else max(2, -(-span // max(nbytes, 1)))


def rotating(tensor: torch.Tensor, device: torch.device):
    """Copies of ``tensor`` filling eight times the last-level cache, and a function returning the
    next one at each call: a bandwidth benchmark then streams its weight from memory every round, as
    a decoding step does, instead of finding it in cache from the round before. Eight, not two: a
    Zen 5's L3 kept enough of a 20 MB int8 weight cycled through 2-4x its 32 MB that the weight's
    packed products read 1.01-1.10x the memory's measured bandwidth; at 8x at most 0.96x. Past 2x
    the copies take at most 1 GB."""
    count = copies_to_stream(tensor.numel() * tensor.element_size(), device)
    copies = [tensor] + [tensor.clone() for _ in range(count - 1)]
    state = {"i": 0}

    def next_copy():
        state["i"] = (state["i"] + 1) % count
        return copies[state["i"]]

    next_copy.count = count  # rounds until the first copy comes back
    return next_copy


def packed_copies(weight, pack, dtype_name: str, enabled: bool = True) -> dict:
    """``{data_ptr: pack(copy)}`` for every copy a :func:`rotating` ``weight`` hands out, made before
    the rounds (empty unless ``enabled``); skips the benchmark where ``pack`` takes no such weight."""
    import pytest

    packs = {}
    for _ in range(weight.count if enabled else 0):
        copy = weight()
        packs[copy.data_ptr()] = pack(copy)
    if enabled and None in packs.values():
        pytest.skip(f"{pack.__name__} does not take {dtype_name}")
    return packs


def run_timed(benchmark, fn, device: torch.device):
    """Warm up once outside the rounds, then time ``fn`` (synchronising the GPU every round). Timed
    CPU runs sample the memory's bandwidth right before the rounds too (:func:`record` holds a case
    streamed from memory against the best of the samples around it)."""
    def call():
        out = fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return out

    if not getattr(benchmark, "disabled", True):  # before the warm-up, which brings the caches back
        before = memory_bandwidth_sample(device)
        if before:
            benchmark.extra_info["copy_gbps_before"] = before
    call()
    return benchmark(call)
