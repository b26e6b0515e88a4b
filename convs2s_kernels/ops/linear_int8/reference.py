"""The ground truth of ``linear_int8`` and the quantiser that makes its weights.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch
import torch.nn.functional as F
__all__ = ["quantize_int8", "linear_int8_ref"]


def check_bits(name: str, bits, allowed: Tuple[int, ...] = (8, 7)) -> int:
    """An int8 operand's width, one of ``allowed`` (a bool is no width), as an int; else a
    one-line error naming the argument and what is allowed."""
    if isinstance(bits, bool) or bits not in allowed:
        raise ValueError(f"{name} must be {' or '.join(map(str, allowed))}, got {bits!r}")
    return int(bits)


def quantize_int8(weight: torch.Tensor, bits: int = 8) -> Tuple[torch.Tensor, torch.Tensor]:
    """Symmetric int8 quantisation per output row: ``weight (N, K) ~ qweight * scale[:, None]``.

    With ``qmax = 2**(bits-1) - 1`` (127 for ``bits`` 8, 63 for 7): ``scale = max|w_n| / qmax``
    (rows of zeros get scale 1), ``qweight = round(w / scale)`` in ``[-qmax, qmax]``; returns
    ``(qweight int8 (N, K), scale float32 (N,))``. The error of each weight is at most ``scale / 2``
    (twice as coarse with 7 bits, which ``linear_w8a8(..., weight_bits=7)`` multiplies faster on AVX2).
    """
    qmax = float(2 ** (check_bits("bits", bits) - 1) - 1)
    w = weight.detach().float()
    scale = w.abs().amax(dim=1) / qmax
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    # contiguous rows whatever w's layout (a transposed conv weight): the kernels stream them
    qweight = torch.round(w / scale.unsqueeze(1)).clamp_(-qmax, qmax).to(torch.int8).contiguous()
    return qweight, scale.contiguous()


def linear_int8_ref(x: torch.Tensor, qweight: torch.Tensor, scale: torch.Tensor,
                    bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``x @ (qweight * scale[:, None]).T + bias``: a linear layer with int8 weights (dequantised here).

    Shapes: ``x (..., K)`` floating, ``qweight (N, K)`` int8, ``scale (N,)``, ``bias (N,)``.
    """
    w = qweight.to(x.dtype) * scale.to(x.dtype).unsqueeze(1)
    return F.linear(x, w, None if bias is None else bias.to(x.dtype))
