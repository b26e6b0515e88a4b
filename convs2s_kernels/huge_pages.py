"""Weights a decoding step streams from memory, on 2 MB transparent huge pages.

A step reads every decoder weight once (381 MB for fconv_wmt_en_fr) and nothing stays in cache
between steps; on 4 KB pages the stream crosses a page every 4 KB (a TLB miss, and a hardware
prefetcher that stops at the boundary); on huge pages it streams faster
(``bench/results/amd-zen5-2c/README.md``). The pages are advised
(``madvise``), so the OS grants them where transparent huge pages are ``always`` or ``madvise``
and the memory is ordinary elsewhere.
"""

from __future__ import annotations

import torch

from .extension import native, unavailable_reason

MIN_BYTES = 2 << 20  # one huge page: smaller tensors stay where they are


def on_huge_pages(t: torch.Tensor) -> torch.Tensor:
    """A contiguous copy of ``t`` on huge pages; ``t`` itself off the CPU, under 2 MB, or without
    the cpp extension (which allocates them)."""
    if unavailable_reason() is not None or t.device.type != "cpu" or t.numel() * t.element_size() < MIN_BYTES:
        return t
    with torch.no_grad():
        return native().huge_page_copy(t.detach())


def move_to_huge_pages(param: torch.nn.Parameter) -> None:
    """Put ``param``'s data on huge pages once (the parameter object, its name and its
    ``requires_grad`` stay; a later assignment of new data is moved again on the next call)."""
    held = getattr(param, "_convs2s_huge_pages", None)
    # `held` keeps the moved memory alive, so an equal address is that memory, not a reuse of it
    if held is not None and held.data_ptr() == param.data_ptr():
        return
    moved = on_huge_pages(param.data)
    if moved is not param.data:
        param.data = moved
    param._convs2s_huge_pages = moved
