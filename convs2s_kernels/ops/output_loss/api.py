"""``output_loss``: the public function (checks its inputs, then calls the backend the dispatcher picks)."""

from __future__ import annotations

from typing import Optional, Tuple

import torch

from ..._checks import check_same, check_shape, check_tensor
from ...dispatch import resolve
from .._common import autocast_inputs

__all__ = ["output_loss", "output_loss_tensors"]


def output_loss_tensors(x, weight, bias, target, **_):
    """The floating tensors of a call, the activation first (for the backends' capabilities)."""
    return x, weight, bias


def output_loss(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], target: torch.Tensor, *,
                label_smoothing: float = 0.0, ignore_index: int = 1,
                backend: Optional[str] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    """The label-smoothed cross-entropy of the logits ``x @ weight.T + bias``, summed over the
    rows whose target is not ``ignore_index``: ``x (N, C)``, ``weight (V, C)``, ``bias (V,)``,
    ``target (N,)`` integer -> ``(loss, nll)``, two float32 scalars (float64 inputs: float64);
    ``loss`` has a gradient, ``nll`` (the unsmoothed part, for logging) none.

    fairseq's label smoothing: the target's weight ``1 - eps``, every other entry ``eps / (V - 1)``.
    Equivalent: ``convs2s_kernels.output_loss_ref``.
    """
    check_tensor("x", x, 2)
    check_tensor("weight", weight, 2)
    if weight.shape[1] != x.shape[1]:
        raise ValueError(f"weight expects {weight.shape[1]} input features but x has {x.shape[1]}")
    if bias is not None:
        check_tensor("bias", bias, 1)
        check_shape("bias", bias, (weight.shape[0],), "(V,)")
    if not isinstance(target, torch.Tensor) or target.dtype.is_floating_point or target.dim() != 1:
        raise TypeError(f"target must be a 1-D integer tensor of shape ({x.shape[0]},)")
    check_shape("target", target, (x.shape[0],), "(N,)")
    if not 0.0 <= label_smoothing < 1.0:
        raise ValueError(f"label_smoothing must lie in [0, 1), got {label_smoothing}")
    if target.device != x.device:
        raise ValueError(f"target is on {target.device} but x is on {x.device}")
    x, weight, bias = autocast_inputs(x.device, x, weight, bias)
    check_same("x", x, weight=weight, bias=bias)
    kwargs = dict(label_smoothing=float(label_smoothing), ignore_index=int(ignore_index))
    fn = resolve("output_loss", x.device, backend, x, weight, bias, target, **kwargs)
    return fn(x, weight, bias, target, **kwargs)
