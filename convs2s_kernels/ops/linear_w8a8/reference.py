"""The ground truth of ``linear_w8a8`` and its activation quantiser."""

from __future__ import annotations

import sys
from typing import Optional, Tuple

import torch

from ..linear_int8.reference import check_bits

__all__ = ["quantize_rows_int8", "pack_w8a8_weight", "linear_w8a8_ref", "ACTIVATION_BITS", "WEIGHT_BITS"]

PACKED_COLUMNS = 64  # output columns per block of the packed layout
ACTIVATION_BITS = (8, 7)  # what linear_w8a8 quantises activations to
WEIGHT_BITS = (8, 7)  # the range linear_w8a8's int8 weights hold: [-127, 127] or [-63, 63]


def check_activation_bits(bits) -> int:
    """``bits`` as an int, or a one-line error naming what is allowed."""
    return check_bits("activation_bits", bits, ACTIVATION_BITS)


def check_weight_bits(bits) -> int:
    """``bits`` as an int, or a one-line error naming what is allowed."""
    return check_bits("weight_bits", bits, WEIGHT_BITS)


def quantize_rows_int8(x: torch.Tensor, bits: int = 8) -> Tuple[torch.Tensor, torch.Tensor]:
    """Symmetric quantisation of each row of ``x (M, K)`` to ``bits`` (8 or 7): ``x ~ xq * sx[:, None]``.

    With ``qmax = 2**(bits-1) - 1`` (127 or 63): ``sx = max|x_m| / qmax`` computed in float32 (rows
    of zeros get 1), ``xq = round(x / sx)`` rounding halves to even, in ``[-qmax, qmax]``; returns
    ``(xq int8 (M, K), sx float32 (M,))``.
    """
    qmax = 2 ** (check_activation_bits(bits) - 1) - 1
    x = x.float()
    sx = x.abs().amax(dim=-1) / qmax
    sx = torch.where(sx > 0, sx, torch.ones_like(sx))
    xq = torch.round(x / sx.unsqueeze(-1)).clamp_(-qmax, qmax).to(torch.int8)
    return xq, sx


def packed_shape(N: int, K: int) -> Tuple[int, int, int, int]:
    """The shape of :func:`pack_w8a8_weight` of an ``(N, K)`` weight."""
    return -(-N // PACKED_COLUMNS), 16 * -(-K // 64) + 1, PACKED_COLUMNS, 4


def pack_w8a8_weight(qweight: torch.Tensor) -> torch.Tensor:
    """``qweight (N, K)`` int8 rearranged for the cpp kernels of ``linear_w8a8``: blocks of 64 output
    columns, in each block 4 consecutive ``k`` of every column side by side (one 64-byte vector holds
    4 ``k`` of 16 outputs, what an integer dot-product instruction takes; 16 such groups are one AMX
    tile), zero past ``N`` and past ``K`` rounded up to 64; then one more group per block holding its
    64 columns' sums ``sum_k qweight[n, k]`` as int32 (little-endian bytes), which the kernels taking
    unsigned activations subtract scaled (made here once, not in every call).

    Returns int8 ``(ceil(N / 64), 16 ceil(K / 64) + 1, 64, 4)``: ``packed[b, k4, c, j] = qweight[64 b + c, 4 k4 + j]``
    for ``k4 < 16 ceil(K / 64)``, and ``packed[b, -1].view(int32)[c] = qweight[64 b + c].sum()``.
    Packing once per weight saves the kernels a rearranging pass on every call.
    """
    if qweight.dtype != torch.int8 or qweight.dim() != 2:
        raise TypeError(f"pack_w8a8_weight takes an int8 (N, K) qweight, got {qweight.dtype} {tuple(qweight.shape)}")
    if sys.byteorder != "little":
        raise RuntimeError("pack_w8a8_weight stores its column sums little-endian, as the cpp kernels read them")
    N, K = qweight.shape
    blocks, k4 = packed_shape(N, K)[:2]
    k4 -= 1  # the groups of k; the last holds the sums
    padded = qweight.new_zeros(blocks * PACKED_COLUMNS, k4 * 4)
    padded[:N, :K] = qweight
    groups = padded.view(blocks, PACKED_COLUMNS, k4, 4).transpose(1, 2)
    sums = padded.sum(dim=1, dtype=torch.int32).view(blocks, 1, PACKED_COLUMNS, 1).view(torch.int8)
    return torch.cat([groups, sums], dim=1).contiguous()


def linear_w8a8_ref(x: torch.Tensor, qweight: torch.Tensor, scale: torch.Tensor,
                    bias: Optional[torch.Tensor] = None, packed: Optional[torch.Tensor] = None,
                    activation_bits: int = 8, weight_bits: int = 8) -> torch.Tensor:
    """``(xq @ qweight.T) * sx[:, None] * scale + bias`` with ``xq, sx = quantize_rows_int8(x, activation_bits)``.
    ``weight_bits`` (8 or 7) only says what range ``qweight`` holds, for the kernels: the sums here
    are exact either way.

    Shapes: ``x (..., K)`` floating, ``qweight (N, K)`` int8, ``scale (N,)``, ``bias (N,)``. The
    integer sums are exact (float64 holds them: |sum| <= 127² K); then, in float32, the two scales'
    product, one multiply and one add, so a kernel with exact integer sums agrees to the last bit.
    ``packed`` (``pack_w8a8_weight(qweight)``, for the kernels) is not read here. Returns float32.
    """
    lead = x.shape[:-1]
    xq, sx = quantize_rows_int8(x.reshape(-1, x.shape[-1]), activation_bits)
    sums = (xq.double() @ qweight.double().T).float()
    y = sums * (sx.unsqueeze(1) * scale.float().unsqueeze(0))
    if bias is not None:
        y = y + bias.float()
    return y.reshape(*lead, qweight.shape[0])
