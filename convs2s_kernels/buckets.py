"""Autotune buckets and Triton's specialisations, and a warm-up that visits each before timing.

A Triton kernel is compiled anew for every combination of its integer arguments' classes (equal
to 1, divisible by 16, anything else: Triton's specialisation) and tuned anew for every autotune
key. The kernels key on bucketed sizes (:func:`bucket`: source lengths, rows), so a new sentence
length does not tune again; but the first length of each bucket does, and the first of each
class compiles, and on a GPU each costs seconds. :func:`warmup` runs a caller's function on one
source length per (bucket, class), each with a few sentence counts (so that rows and rows x length
take every class too), so that a timing that follows (the speed table's) never pays for tuning or
compiling. Strides are specialised as well: channel counts that are multiples of 16 (every fconv
architecture's) keep them in one class.
"""

from __future__ import annotations

from typing import Callable, List

import torch

# sentence counts a warm-up decodes at each length: rows (sentences x beam, sentences x length) of every class
WARMUP_SENTENCES = (1, 2, 16)


def bucket(n: int) -> int:
    """The Triton kernels' autotune key of a varying size (``triton_common.config.bucket``, which
    this module cannot import without Triton; a test holds the two equal): the next power of two,
    at least 16."""
    return max(16, 1 << max(0, n - 1).bit_length())


def specialization(n: int) -> str:
    """The class Triton compiles an integer argument for: ``"1"``, ``"16k"`` (divisible by 16) or ``"any"``."""
    return "1" if n == 1 else "16k" if n % 16 == 0 else "any"


def warmup_lengths(largest: int, smallest: int = 1) -> List[int]:
    """Sizes in ``[smallest, largest]`` covering every (bucket, specialisation) pair the range
    holds, the largest of each pair, ascending."""
    if smallest < 1 or largest < smallest:
        raise ValueError(f"need 1 <= smallest <= largest, got smallest={smallest}, largest={largest}")
    chosen = {}
    for n in range(largest, smallest - 1, -1):  # at most a few thousand sizes: the positions' limit
        chosen.setdefault((bucket(n), specialization(n)), n)
    return sorted(chosen.values())


def warmup(run: Callable[[int, int], object], *, max_source_length: int, min_source_length: int = 1,
           device=None) -> List[int]:
    """``run(S, sentences)`` for every length of :func:`warmup_lengths` (source lengths count
    EOS) and every count of :data:`WARMUP_SENTENCES`; waits for the device at the end. Returns
    the lengths run."""
    lengths = warmup_lengths(max_source_length, min_source_length)
    for S in lengths:
        for sentences in WARMUP_SENTENCES:
            run(S, sentences)
    if device is not None and torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)
    return lengths
