"""``attention_embsum`` on the cpp backend: batched GEMMs through ATen with the masked softmax and
the scales fused around them (``csrc/attention_embsum_cpu.cpp``), a ``torch.library`` custom op with an
autograd formula (for ``torch.compile``; eager calls take the same kernels through a plain
``autograd.Function``)."""

from __future__ import annotations

from typing import Optional, Tuple

import torch
from torch import Tensor

from ...dispatch import Capability, register
from ...extension import CPP_DTYPES, native
from .api import attention_tensors

CAPABILITY = Capability(dtypes={"cpu": CPP_DTYPES}, backward=True)


@torch.library.custom_op("convs2s::attention_embsum_cpu", mutates_args=())
def _attention_op(q: Tensor, z: Tensor, y: Tensor, src_lengths: Optional[Tensor], left_pad: bool) -> Tuple[Tensor, Tensor]:
    ctx, p_scaled = native().attention_forward(q, z, y, src_lengths, left_pad)
    return ctx, p_scaled


@_attention_op.register_fake
def _(q, z, y, src_lengths, left_pad):
    B, T, E = q.shape
    return q.new_empty(B, T, E), q.new_empty(B, T, z.shape[1])


@torch.library.custom_op("convs2s::attention_embsum_cpu_backward", mutates_args=())
def _attention_backward_op(dctx: Tensor, q: Tensor, z: Tensor, y: Tensor, p_scaled: Tensor,
                           src_lengths: Optional[Tensor], left_pad: bool,
                           dp_scaled: Optional[Tensor]) -> Tuple[Tensor, Tensor, Tensor]:
    dq, dz, dy = native().attention_backward(dctx, q, z, y, p_scaled, src_lengths, left_pad, dp_scaled)
    return dq, dz, dy


@_attention_backward_op.register_fake
def _(dctx, q, z, y, p_scaled, src_lengths, left_pad, dp_scaled):
    return torch.empty_like(q), torch.empty_like(z), torch.empty_like(y)


def _attention_setup(ctx, inputs, output):
    q, z, y, src_lengths, left_pad = inputs
    ctx.save_for_backward(q, z, y, output[1], src_lengths)
    ctx.left_pad = left_pad


def _attention_grads(ctx, dctx, dp_scaled, backward):
    """The inputs' gradients from what _attention_setup saved, by ``backward`` (the native call or its
    custom op); dp_scaled: the gradient reaching the returned probabilities (return_attn), zeros or None otherwise."""
    q, z, y, p_scaled, src_lengths = ctx.saved_tensors
    dctx = torch.zeros_like(q) if dctx is None else dctx.contiguous()
    dp_scaled = None if dp_scaled is None else dp_scaled.contiguous()
    dq, dz, dy = backward(dctx, q, z, y, p_scaled, src_lengths, ctx.left_pad, dp_scaled)
    return dq, dz, dy, None, None


def _attention_backward(ctx, dctx, dp_scaled):
    return _attention_grads(ctx, dctx, dp_scaled, _attention_backward_op)


_attention_op.register_autograd(_attention_backward, setup_context=_attention_setup)


class _Attention(torch.autograd.Function):
    """The same forward and backward as the custom op, for eager calls (a plain Function's dispatch
    costs less than the custom op's: bench/results/amd-zen3-2c/training-ops.md, "The conv+GLU op's
    eager path")."""

    @staticmethod
    def forward(ctx, *inputs):
        out, p_scaled = native().attention_forward(*inputs)
        _attention_setup(ctx, inputs, (out, p_scaled))
        ctx.set_materialize_grads(False)  # an unused output's gradient stays None: no zeros made
        return out, p_scaled

    @staticmethod
    @torch.autograd.function.once_differentiable  # the kernels have no derivative of their own
    def backward(ctx, dctx, dp_scaled):
        return _attention_grads(ctx, dctx, dp_scaled, native().attention_backward)


def attention_embsum_cpp(q, z, y, src_lengths=None, *, left_pad=True, return_attn=False):
    args = (q.contiguous(), z.contiguous(), y.contiguous(), src_lengths, bool(left_pad))
    if torch.compiler.is_compiling():  # the custom op: traced as one node
        ctx, p_scaled = _attention_op(*args)
    elif torch.is_grad_enabled() and any(t.requires_grad for t in args[:3]):
        ctx, p_scaled = _Attention.apply(*args)
    else:
        ctx, p_scaled = native().attention_forward(*args)
    if not return_attn:
        return ctx
    n = src_lengths if src_lengths is not None else torch.full((q.shape[0],), z.shape[1], device=q.device)
    return ctx, p_scaled / n.to(p_scaled.dtype).sqrt().view(-1, 1, 1)


register("cpp", "attention_embsum", attention_embsum_cpp, CAPABILITY, attention_tensors)
