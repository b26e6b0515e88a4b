"""Autotune buckets, and tuning before timing: one call per bucket of the sizes that vary.

The Triton kernels key their autotuning on bucketed sizes (:func:`bucket`: source lengths,
rows), so a new sentence length does not tune again, but the first length of each bucket does,
and on a GPU that costs seconds. :func:`warmup` runs a caller's function once per bucket of
source lengths, so that a timing that follows (the speed table's) never pays for tuning or
compiling; on a CPU it makes the same calls (cheap) and the cpp backend's kernel choice
(:mod:`convs2s_kernels.tune`) happens on the way.
"""

from __future__ import annotations

from typing import Callable, List

import torch


def bucket(n: int) -> int:
    """The Triton kernels' autotune key of a varying size (``triton_common.config.bucket``, which
    this module cannot import without Triton; a test holds the two equal): the next power of two,
    at least 16."""
    return max(16, 1 << max(0, n - 1).bit_length())


def bucket_representatives(largest: int, smallest: int = 1) -> List[int]:
    """One size per bucket of ``[smallest, largest]``: each bucket's largest size in the range."""
    if smallest < 1 or largest < smallest:
        raise ValueError(f"need 1 <= smallest <= largest, got smallest={smallest}, largest={largest}")
    sizes, n = [], largest
    while n >= smallest:
        sizes.append(n)
        lower = bucket(n) // 2  # the previous bucket's top (0 below the first bucket)
        n = lower if lower >= 16 else 0
    return sorted(sizes)


def warmup(run: Callable[[int], object], *, max_source_length: int, min_source_length: int = 1,
           device=None) -> List[int]:
    """``run(S)`` once for one source length ``S`` per autotune bucket between the two bounds
    (source lengths count EOS); waits for the device at the end. Returns the lengths run."""
    lengths = bucket_representatives(max_source_length, min_source_length)
    for S in lengths:
        run(S)
    if device is not None and torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)
    return lengths
