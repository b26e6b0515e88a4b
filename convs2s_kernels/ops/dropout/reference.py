"""``dropout_ref``: the plain-PyTorch ground truth of ``dropout``: the mask's hash computed in
int64 tensor ops with the 32-bit wrap-around of ``csrc/dropout_cpu.cpp`` (also the ``reference``
backend; autograd through the multiplication)."""

from __future__ import annotations

from typing import Union

import torch

MASK32 = 0xFFFFFFFF


def keep_mask(numel: int, p: float, seed: Union[int, torch.Tensor], device=None) -> torch.Tensor:
    """Which of ``numel`` elements (row-major) dropout keeps for ``seed``: murmur3's finaliser of
    ``i * 0x9E3779B1 + (seed_lo ^ seed_hi)`` mod 2^32, kept when at least ``floor(p * 2^32)``.
    ``seed`` may be a one-element int64 tensor (the seed ``dropout`` draws inside a
    ``torch.compile`` graph, never read on the host): the same mask, in tensor ops."""
    # a tensor seed: 0-dim, so it joins a tensor on any device; only mix's low 32 bits count (masked
    # below), which int64's arithmetic shift gives as the kernel's unsigned one does
    s = seed.reshape(()).to(torch.int64) if isinstance(seed, torch.Tensor) else int(seed) & 0xFFFFFFFFFFFFFFFF
    mix = (s & MASK32) ^ (s >> 32)
    h = (torch.arange(numel, dtype=torch.int64, device=device) * 0x9E3779B1 + mix) & MASK32
    h = h ^ (h >> 16)
    h = (h * 0x85EBCA6B) & MASK32
    h = h ^ (h >> 13)
    h = (h * 0xC2B2AE35) & MASK32
    h = h ^ (h >> 16)
    return h >= int(p * 4294967296.0)


def dropout_ref(x: torch.Tensor, *, p: float, seed: Union[int, torch.Tensor]) -> torch.Tensor:
    keep = keep_mask(x.numel(), p, seed, x.device).view(x.shape)
    return x * keep.to(x.dtype) * (1.0 / (1.0 - p))
