"""``linear``: the public function (checks its inputs, then calls the backend the dispatcher picks)."""

from __future__ import annotations

from typing import Optional

import torch

from ..._checks import check_same, check_shape, check_tensor
from ...dispatch import resolve
from .._packing import check_packed_matrix
from .._common import autocast_inputs

__all__ = ["linear", "linear_tensors"]


def linear_tensors(x, weight, bias=None, packed=None):
    """The floating tensors of a call, the activation first (for the backends' capabilities)."""
    return x, weight, bias


def linear(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None, *,
           packed: Optional[torch.Tensor] = None, backend: Optional[str] = None) -> torch.Tensor:
    """``x @ weight.T + bias``: the decoder step's projections, where only a few rows (one per
    sentence x beam) meet a large weight. ``x (..., K)``, ``weight (N, K)``, ``bias (N,)``.
    ``packed``: ``pack_linear_weight(weight)``, which the cpp kernel reads instead of ``weight``
    (made once per weight; the reference ignores it). Equivalent: ``F.linear(x, weight, bias)``."""
    if not isinstance(x, torch.Tensor) or x.dim() == 0:
        raise TypeError(f"x must be a tensor of shape (..., K), got {type(x).__name__}"
                        + (" of 0 dimensions" if isinstance(x, torch.Tensor) else ""))
    check_tensor("x", x, x.dim())  # any leading dims; floating point
    check_tensor("weight", weight, 2)
    if weight.shape[1] != x.shape[-1]:
        raise ValueError(f"weight expects {weight.shape[1]} input features but x has {x.shape[-1]}")
    if bias is not None:
        check_tensor("bias", bias, 1)
        check_shape("bias", bias, (weight.shape[0],), "(N,)")
    x, weight, bias = autocast_inputs(x.device, x, weight, bias)
    check_same("x", x, weight=weight, bias=bias)
    fn = resolve("linear", x.device, backend, x, weight, bias)
    if packed is None:
        return fn(x, weight, bias)
    check_packed_matrix(packed, weight, weight.t(), "pack_linear_weight")
    return fn(x, weight, bias, packed)
