"""``attention_embsum`` on the cpp backend: batched GEMMs through ATen with the masked softmax and
the scales fused around them (``csrc/attention_embsum_cpu.cpp``), a ``torch.library`` custom op with an
autograd formula."""

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


def _attention_backward(ctx, dctx, dp_scaled):
    # dp_scaled: the gradient reaching the returned probabilities (return_attn), zeros otherwise
    q, z, y, p_scaled, src_lengths = ctx.saved_tensors
    dq, dz, dy = _attention_backward_op(dctx.contiguous(), q, z, y, p_scaled, src_lengths, ctx.left_pad,
                                        dp_scaled)
    return dq, dz, dy, None, None


_attention_op.register_autograd(_attention_backward, setup_context=_attention_setup)


def attention_embsum_cpp(q, z, y, src_lengths=None, *, left_pad=True, return_attn=False):
    ctx, p_scaled = _attention_op(q.contiguous(), z.contiguous(), y.contiguous(), src_lengths, bool(left_pad))
    if not return_attn:
        return ctx
    n = src_lengths if src_lengths is not None else torch.full((q.shape[0],), z.shape[1], device=q.device)
    return ctx, p_scaled / n.to(p_scaled.dtype).sqrt().view(-1, 1, 1)


register("cpp", "attention_embsum", attention_embsum_cpp, CAPABILITY, attention_tensors)
