"""Checks of a weight packed for the cpp kernels' (K, N) layout (``pack_kn_weight``: blocks of
columns, each a contiguous (K, width) run), shared by ``conv_step`` and ``linear``."""

from __future__ import annotations

import torch

from .._checks import write_version
from ..extension import native


def _contents_key(t: torch.Tensor) -> tuple:
    return t.data_ptr(), write_version(t), tuple(t.shape), t.dtype


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    # bit for bit: torch.equal is False for any NaN, which would call a diverged weight's packing stale
    ints = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(a.view(ints), b.view(ints))


def packed_from(packed: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``packed``, just made from ``weight`` by ``pack_kn_weight``, marked as checked against it at
    their present versions: the first call's check would pack it a second time, half of a large
    model's preparation (bench/results/kernel-decisions.md#packing-trusted-as-made)."""
    _mark(packed, weight)
    return packed


def _mark(packed: torch.Tensor, weight: torch.Tensor) -> None:
    """Remember that ``packed`` holds ``weight`` at their present versions. ``packed`` keeps
    ``weight`` alive: a freed weight's address, reused by another, must not pass for it."""
    packed._convs2s_packing_checked = (_contents_key(weight), _contents_key(packed))
    packed._convs2s_packed_from = weight


def check_packed_matrix(packed: torch.Tensor, weight: torch.Tensor, matrix: torch.Tensor, maker: str) -> None:
    """``packed`` is ``maker(weight)``, the (K, N) ``matrix`` view of ``weight`` packed: its shape
    and dtype each call, its contents once per pair of tensors and versions (a stale packing
    would multiply by another weight)."""
    if not isinstance(packed, torch.Tensor) or packed.dim() != 3 or packed.dtype != weight.dtype:
        got = f"{packed.dtype} {tuple(packed.shape)}" if isinstance(packed, torch.Tensor) else type(packed).__name__
        raise ValueError(f"packed must be {maker}(weight): a {weight.dtype} (blocks, K, width) tensor, got {got}")
    K, N = matrix.shape
    width = packed.shape[2]
    if packed.device != weight.device or packed.shape[1] != K or width < 1 or packed.shape[0] != -(-N // width):
        raise ValueError(f"packed {tuple(packed.shape)} on {packed.device} is not {maker} of this "
                         f"{tuple(weight.shape)} weight on {weight.device}")
    key = (_contents_key(weight), _contents_key(packed))
    if getattr(packed, "_convs2s_packing_checked", None) == key:
        return
    if not _same_bits(packed, native().pack_kn_weight(matrix.detach())):
        raise ValueError(f"packed is not {maker}(weight): pack the weight again after changing it "
                         "(or in this process: the layout follows the CPU's instruction set)")
    _mark(packed, weight)
