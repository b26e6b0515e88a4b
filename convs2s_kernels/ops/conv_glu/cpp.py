"""``conv_glu`` on the cpp backend: one GEMM (im2col) through ATen with everything around it in
one pass (``csrc/conv_glu_cpu.cpp``), registered as a ``torch.library`` custom op with an autograd
formula, so ``torch.compile`` traces it."""

from __future__ import annotations

from typing import Optional, Tuple

import torch
from torch import Tensor

from ...dispatch import Capability, register
from ...extension import CPP_DTYPES, native
from .api import conv_glu_tensors

CAPABILITY = Capability(dtypes={"cpu": CPP_DTYPES}, backward=True)


@torch.library.custom_op("convs2s::conv_glu_cpu", mutates_args=())
def _conv_glu_op(x: Tensor, weight: Tensor, bias: Optional[Tensor], residual: Optional[Tensor],
                 pad_mask: Optional[Tensor], causal: bool, scale: float, packed: Optional[Tensor]) -> Tuple[Tensor, Tensor]:
    out, pre = native().conv_glu_forward(x, weight, bias, residual, pad_mask, causal, scale, packed)
    return out, pre


@_conv_glu_op.register_fake
def _(x, weight, bias, residual, pad_mask, causal, scale, packed):
    B, T, _ = x.shape
    return x.new_empty(B, T, weight.shape[2] // 2), x.new_empty(B * T, weight.shape[2])


@torch.library.custom_op("convs2s::conv_glu_cpu_backward", mutates_args=())
def _conv_glu_backward_op(dout: Tensor, x: Tensor, weight: Tensor, pre: Tensor, pad_mask: Optional[Tensor],
                          causal: bool, scale: float, need_residual_grad: bool) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    dx, dw, db, dres = native().conv_glu_backward(dout, x, weight, pre, pad_mask, causal, scale, need_residual_grad)
    return dx, dw, db, dres if dres is not None else x.new_empty(0)


@_conv_glu_backward_op.register_fake
def _(dout, x, weight, pre, pad_mask, causal, scale, need_residual_grad):
    dres = torch.empty_like(dout) if need_residual_grad else x.new_empty(0)
    return torch.empty_like(x), torch.empty_like(weight), weight.new_empty(weight.shape[2]), dres


def _conv_glu_setup(ctx, inputs, output):
    x, weight, bias, residual, pad_mask, causal, scale, _packed = inputs
    ctx.save_for_backward(x, weight, output[1], pad_mask)
    ctx.causal, ctx.scale = causal, scale
    ctx.has_bias, ctx.has_residual = bias is not None, residual is not None


def _conv_glu_backward(ctx, dout, _dpre):
    x, weight, pre, pad_mask = ctx.saved_tensors
    dx, dw, db, dres = _conv_glu_backward_op(dout.contiguous(), x, weight, pre, pad_mask, ctx.causal, ctx.scale,
                                             ctx.has_residual and ctx.needs_input_grad[3])
    return dx, dw, db if ctx.has_bias else None, dres if dres.numel() else None, None, None, None, None


_conv_glu_op.register_autograd(_conv_glu_backward, setup_context=_conv_glu_setup)


def conv_glu_cpp(x, weight, bias=None, *, causal, residual=None, scale=None, pad_mask=None, packed=None):
    out, _ = _conv_glu_op(x.contiguous(), weight.contiguous(), None if bias is None else bias.contiguous(),
                          None if residual is None else residual.contiguous(),
                          None if pad_mask is None else pad_mask.contiguous(), bool(causal),
                          1.0 if scale is None else float(scale), packed)
    return out


register("cpp", "conv_glu", conv_glu_cpp, CAPABILITY, conv_glu_tensors)
