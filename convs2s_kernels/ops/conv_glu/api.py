"""``conv_glu``: the public function (checks its inputs, then calls the backend the dispatcher picks)."""

from __future__ import annotations

from typing import Optional

import torch

from ..._checks import check_same, check_shape, check_tensor
from ...dispatch import resolve
from .._common import autocast_inputs, check_conv_weight
from ..conv_step.packing import check_packed_weight

__all__ = ["conv_glu", "conv_glu_tensors"]


def conv_glu_tensors(x, weight, bias=None, *, residual=None, **_):
    """The floating tensors of a call, the activation first (for the backends' capabilities)."""
    return x, weight, bias, residual


def conv_glu(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None, *, causal: bool,
             residual: Optional[torch.Tensor] = None, scale: Optional[float] = None,
             pad_mask: Optional[torch.Tensor] = None, packed: Optional[torch.Tensor] = None,
             backend: Optional[str] = None) -> torch.Tensor:
    """Convolution (causal or centred) + GLU, with bias, residual and scale fused.

    ``x (B, T, C_in)``, ``weight (k, C_in, 2C)``, ``bias (2C,)``, ``residual (B, T, C)``,
    ``pad_mask (B, T)`` bool (True = padding, zeroed before the convolution) -> ``(B, T, C)``.
    ``packed``: ``pack_conv_step_weight(weight)``, which the cpp kernel reads instead of ``weight``
    (inference: no gradient flows to it) where the kernel choice gives it the rows; the other
    backends ignore it.
    Equivalent: ``(F.glu(conv1d(pad(x)), dim=-1) + residual) * scale``; see
    :func:`convs2s_kernels.conv_glu_ref`.
    """
    check_tensor("x", x, 3)
    c_out = check_conv_weight("x", x.shape[2], weight, bias)
    B, T, _ = x.shape
    if residual is not None:
        check_tensor("residual", residual, 3)
        check_shape("residual", residual, (B, T, c_out), "(B, T, C)")
    if pad_mask is not None:
        check_tensor("pad_mask", pad_mask, 2, floating=False)
        check_shape("pad_mask", pad_mask, (B, T), "(B, T)")
        if pad_mask.dtype != torch.bool:
            raise TypeError(f"pad_mask must be a bool tensor (True = padding), got {pad_mask.dtype}")
        if pad_mask.device != x.device:
            raise ValueError(f"pad_mask is on {pad_mask.device} but x is on {x.device}")
    x, weight, bias, residual = autocast_inputs(x.device, x, weight, bias, residual)
    check_same("x", x, weight=weight, bias=bias, residual=residual)
    if packed is not None:
        check_packed_weight(packed, weight)
    kwargs = dict(causal=causal, residual=residual, scale=scale, pad_mask=pad_mask, packed=packed)
    fn = resolve("conv_glu", x.device, backend, x, weight, bias, **kwargs)
    return fn(x, weight, bias, **kwargs)
