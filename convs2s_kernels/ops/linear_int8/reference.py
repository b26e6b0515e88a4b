"""The ground truth of ``linear_int8`` and the quantiser that makes its weights.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch
import torch.nn.functional as F
__all__ = ["quantize_int8", "linear_int8_ref"]


def quantize_int8(weight: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """Symmetric int8 quantisation per output row: ``weight (N, K) ~ qweight * scale[:, None]``.

    ``scale = max|w_n| / 127`` (rows of zeros get scale 1), ``qweight = round(w / scale)`` in
    ``[-127, 127]``; returns ``(qweight int8 (N, K), scale float32 (N,))``. The error of each
    weight is at most ``scale / 2``.
    """
    w = weight.detach().float()
    scale = w.abs().amax(dim=1) / 127.0
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    # contiguous rows whatever w's layout (a transposed conv weight): the kernels stream them
    qweight = torch.round(w / scale.unsqueeze(1)).clamp_(-127, 127).to(torch.int8).contiguous()
    return qweight, scale.contiguous()


def linear_int8_ref(x: torch.Tensor, qweight: torch.Tensor, scale: torch.Tensor,
                    bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``x @ (qweight * scale[:, None]).T + bias``: a linear layer with int8 weights (dequantised here).

    Shapes: ``x (..., K)`` floating, ``qweight (N, K)`` int8, ``scale (N,)``, ``bias (N,)``.
    """
    w = qweight.to(x.dtype) * scale.to(x.dtype).unsqueeze(1)
    return F.linear(x, w, None if bias is None else bias.to(x.dtype))
