"""``linear_int8``: the public function (checks its inputs, then calls the backend the dispatcher picks)."""

from __future__ import annotations

from typing import Optional

import torch

from ..._checks import check_shape, check_tensor
from ...dispatch import resolve

__all__ = ["linear_int8", "linear_int8_tensors", "check_int8_linear_args"]


def check_int8_linear_args(x, qweight, scale, bias) -> None:
    """The checks of a linear op with an int8 weight (``linear_int8``, ``linear_w8a8``)."""
    if not isinstance(x, torch.Tensor) or x.dim() == 0:
        raise TypeError("x must be a tensor of shape (..., K)")
    check_tensor("x", x, x.dim())
    check_tensor("qweight", qweight, 2, floating=False)
    if qweight.dtype != torch.int8:
        raise TypeError(f"qweight must be int8 (from quantize_int8), got {qweight.dtype}")
    N, K = qweight.shape
    if K != x.shape[-1]:
        raise ValueError(f"qweight expects {K} input features but x has {x.shape[-1]}")
    check_tensor("scale", scale, 1)
    check_shape("scale", scale, (N,), "(N,)")
    if bias is not None:
        check_tensor("bias", bias, 1)
        check_shape("bias", bias, (N,), "(N,)")
    for name, t in (("qweight", qweight), ("scale", scale), ("bias", bias)):
        if t is not None and t.device != x.device:
            raise ValueError(f"{name} is on {t.device} but x is on {x.device}")


def linear_int8_tensors(x, qweight, scale, bias=None, packed=None, activation_bits=8, weight_bits=8):
    """The floating tensors of a call, the activation first (for the backends' capabilities);
    ``packed`` (``linear_w8a8``'s int8 weight layout) holds none, ``activation_bits`` and
    ``weight_bits`` (its operands' widths) are no tensors."""
    return x, scale, bias


def linear_int8(x: torch.Tensor, qweight: torch.Tensor, scale: torch.Tensor, bias: Optional[torch.Tensor] = None,
                *, backend: Optional[str] = None) -> torch.Tensor:
    """``x @ (qweight * scale[:, None]).T + bias``: weight-only int8 for the decoding step, where
    streaming the weights bounds the time (a quarter of float32's bytes; activations and sums stay
    in ``x``'s dtype). ``x (..., K)``, ``qweight (N, K)`` int8 and ``scale (N,)`` from
    :func:`convs2s_kernels.quantize_int8`, ``bias (N,)``. See :func:`convs2s_kernels.linear_int8_ref`."""
    check_int8_linear_args(x, qweight, scale, bias)
    fn = resolve("linear_int8", x.device, backend, x, qweight, scale, bias)
    return fn(x, qweight, scale, bias)
