"""The ground truth of ``linear_w8a8`` and its activation quantiser."""

from __future__ import annotations

from typing import Optional, Tuple

import torch

__all__ = ["quantize_rows_int8", "linear_w8a8_ref"]


def quantize_rows_int8(x: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """Symmetric int8 quantisation of each row of ``x (M, K)``: ``x ~ xq * sx[:, None]``.

    ``sx = max|x_m| / 127`` computed in float32 (rows of zeros get 1), ``xq = round(x / sx)``
    rounding halves to even, in ``[-127, 127]``; returns ``(xq int8 (M, K), sx float32 (M,))``.
    """
    x = x.float()
    sx = x.abs().amax(dim=-1) / 127
    sx = torch.where(sx > 0, sx, torch.ones_like(sx))
    xq = torch.round(x / sx.unsqueeze(-1)).clamp_(-127, 127).to(torch.int8)
    return xq, sx


def linear_w8a8_ref(x: torch.Tensor, qweight: torch.Tensor, scale: torch.Tensor,
                    bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``(xq @ qweight.T) * sx[:, None] * scale + bias`` with ``xq, sx = quantize_rows_int8(x)``.

    Shapes: ``x (..., K)`` floating, ``qweight (N, K)`` int8, ``scale (N,)``, ``bias (N,)``. The
    integer sums are exact (float64 holds them: |sum| <= 127² K); then, in float32, the two scales'
    product, one multiply and one add, so a kernel with exact integer sums agrees to the last bit.
    Returns float32.
    """
    lead = x.shape[:-1]
    xq, sx = quantize_rows_int8(x.reshape(-1, x.shape[-1]))
    sums = (xq.double() @ qweight.double().T).float()
    y = sums * (sx.unsqueeze(1) * scale.float().unsqueeze(0))
    if bias is not None:
        y = y + bias.float()
    return y.reshape(*lead, qweight.shape[0])
