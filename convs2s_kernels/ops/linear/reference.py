"""The ground truth of ``linear``: PyTorch's own ``F.linear``."""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

__all__ = ["linear_ref"]


def linear_ref(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None,
               packed: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``x @ weight.T + bias``. Shapes: ``x (..., K)``, ``weight (N, K)``, ``bias (N,)``. ``packed``
    (``pack_linear_weight(weight)``, for the cpp kernel) is not read here."""
    return F.linear(x, weight, bias)
