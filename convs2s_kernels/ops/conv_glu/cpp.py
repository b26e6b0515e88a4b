"""``conv_glu`` on the cpp backend: one GEMM (im2col) through ATen with everything around it in
one pass (``csrc/conv_glu_cpu.cpp``), registered as a ``torch.library`` custom op with an autograd
formula, so ``torch.compile`` traces it (eager calls take the same kernels through a plain
``autograd.Function``). In training, a width-3 convolution of enough rows runs as
Winograd's F(m, 3) instead (:func:`winograd_tile`)."""

from __future__ import annotations

import os
from typing import Optional, Tuple

import torch
from torch import Tensor

from ...dispatch import Capability, note_variant, register
from ...extension import CPP_DTYPES, native
from .api import conv_glu_tensors

CAPABILITY = Capability(dtypes={"cpu": CPP_DTYPES}, backward=True)

# The output steps per Winograd tile for training's width-3 convolutions: 0 (im2col and one GEMM),
# 2 (F(2, 3): 1.5x fewer multiply-adds) or 4 (F(4, 3): 2x); CONVS2S_CONV_WINOGRAD overrides it.
WINOGRAD_TILE = 4
# below this many rows (B * T) a layer keeps im2col: the transforms' passes cost more than they save
# (bench/results/amd-zen3-2c/training-ops.md, "Winograd F(m, 3)")
WINOGRAD_MIN_ROWS = 256


def winograd_label(tile: int) -> str:
    """How a call served by Winograd tiles is labelled in ``count_dispatches`` (``"cpp, <label>"``)."""
    return f"winograd F({tile},3)"


def winograd_tile_of(backend_label: str) -> int:
    """The tile m in a label made by :func:`winograd_label` (inside a backend's label), else 0."""
    head, found, tail = backend_label.partition("winograd F(")
    return int(tail.split(",")[0]) if found else 0


def winograd_tile(x: Tensor, weight: Tensor) -> int:
    """The Winograd tile (0 = none) for a call: only where gradients will be taken (so validation,
    generation and the fairseq comparisons keep im2col's exact summation order), k = 3, fp32/fp64."""
    tile = int(os.environ.get("CONVS2S_CONV_WINOGRAD", WINOGRAD_TILE))
    if tile not in (0, 2, 4):
        raise ValueError(f"CONVS2S_CONV_WINOGRAD must be 0, 2 or 4, got {tile}")
    training = torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad)
    if (not training or weight.shape[0] != 3 or x.dtype not in (torch.float32, torch.float64)
            or x.shape[0] * x.shape[1] < WINOGRAD_MIN_ROWS):
        return 0
    return tile


@torch.library.custom_op("convs2s::conv_glu_cpu", mutates_args=())
def _conv_glu_op(x: Tensor, weight: Tensor, bias: Optional[Tensor], residual: Optional[Tensor],
                 pad_mask: Optional[Tensor], causal: bool, scale: float, packed: Optional[Tensor],
                 winograd: int) -> Tuple[Tensor, Tensor]:
    out, pre = native().conv_glu_forward(x, weight, bias, residual, pad_mask, causal, scale, packed, winograd)
    return out, pre


@_conv_glu_op.register_fake
def _(x, weight, bias, residual, pad_mask, causal, scale, packed, winograd):
    B, T, _ = x.shape
    return x.new_empty(B, T, weight.shape[2] // 2), x.new_empty(B * T, weight.shape[2])


@torch.library.custom_op("convs2s::conv_glu_cpu_backward", mutates_args=())
def _conv_glu_backward_op(dout: Tensor, x: Tensor, weight: Tensor, pre: Tensor, pad_mask: Optional[Tensor],
                          causal: bool, scale: float, need_residual_grad: bool,
                          winograd: int) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    dx, dw, db, dres = native().conv_glu_backward(dout, x, weight, pre, pad_mask, causal, scale, need_residual_grad,
                                                  winograd)
    return dx, dw, db, dres if dres is not None else x.new_empty(0)


@_conv_glu_backward_op.register_fake
def _(dout, x, weight, pre, pad_mask, causal, scale, need_residual_grad, winograd):
    dres = torch.empty_like(dout) if need_residual_grad else x.new_empty(0)
    return torch.empty_like(x), torch.empty_like(weight), weight.new_empty(weight.shape[2]), dres


def _conv_glu_setup(ctx, inputs, output):
    x, weight, bias, residual, pad_mask, causal, scale, _packed, winograd = inputs
    ctx.save_for_backward(x, weight, output[1], pad_mask)
    ctx.causal, ctx.scale, ctx.winograd = causal, scale, winograd
    ctx.has_bias, ctx.has_residual = bias is not None, residual is not None


def _conv_glu_grads(ctx, dout, backward):
    """The inputs' gradients from what _conv_glu_setup saved, by ``backward`` (the native call or its custom op)."""
    x, weight, pre, pad_mask = ctx.saved_tensors
    need_dres = ctx.has_residual and ctx.needs_input_grad[3]
    dx, dw, db, dres = backward(dout.contiguous(), x, weight, pre, pad_mask, ctx.causal, ctx.scale, need_dres,
                                ctx.winograd)
    return dx, dw, db if ctx.has_bias else None, dres if need_dres else None, None, None, None, None, None


def _conv_glu_backward(ctx, dout, _dpre):
    return _conv_glu_grads(ctx, dout, _conv_glu_backward_op)


_conv_glu_op.register_autograd(_conv_glu_backward, setup_context=_conv_glu_setup)


class _ConvGlu(torch.autograd.Function):
    """The same forward and backward as the custom op, for eager calls: the custom op's Python
    dispatch and autograd registration cost more than a plain Function's
    (bench/results/amd-zen3-2c/training-ops.md, "The conv+GLU op's eager path")."""

    @staticmethod
    def forward(ctx, *inputs):
        out, pre = native().conv_glu_forward(*inputs)
        _conv_glu_setup(ctx, inputs, (out, pre))
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable  # the kernels have no derivative of their own
    def backward(ctx, dout):
        return _conv_glu_grads(ctx, dout, native().conv_glu_backward)


def conv_glu_cpp(x, weight, bias=None, *, causal, residual=None, scale=None, pad_mask=None, packed=None):
    tile = winograd_tile(x, weight)
    if tile:
        note_variant("conv_glu", "cpp", winograd_label(tile))
    args = (x.contiguous(), weight.contiguous(), None if bias is None else bias.contiguous(),
            None if residual is None else residual.contiguous(), None if pad_mask is None else pad_mask.contiguous(),
            bool(causal), 1.0 if scale is None else float(scale), packed, tile)
    if torch.compiler.is_compiling():  # the custom op: traced as one node
        return _conv_glu_op(*args)[0]
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in args[:4]):
        return _ConvGlu.apply(*args)
    return native().conv_glu_forward(*args)[0]


register("cpp", "conv_glu", conv_glu_cpp, CAPABILITY, conv_glu_tensors)
