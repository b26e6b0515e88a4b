"""Helpers for the benchmark suites (kept out of conftest.py so tests and bench never clash)."""

import torch


def record(benchmark, *, flops: float, bytes_moved: float) -> None:
    """Put FLOPs, bytes and the achieved rates (from the median) into the result's extra_info."""
    benchmark.extra_info["flops"] = flops
    benchmark.extra_info["bytes"] = bytes_moved
    benchmark.extra_info["threads"] = torch.get_num_threads()
    stats = getattr(benchmark, "stats", None)
    median = getattr(getattr(stats, "stats", None), "median", None) if stats is not None else None
    if median:
        benchmark.extra_info["gflops_per_s"] = flops / median / 1e9
        benchmark.extra_info["gb_per_s"] = bytes_moved / median / 1e9
