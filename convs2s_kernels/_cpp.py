"""Loader of the C++ CPU extension ``convs2s_kernels._C`` and its registration with the dispatcher.

The package works without the extension (the reference backend covers every op); when it
is missing, :func:`convs2s_kernels.available_backends` reports why.
"""

from __future__ import annotations

import os
from typing import List, Optional, Tuple

import torch
from torch import Tensor

from .dispatch import register, set_availability

DISABLE_ENV = "CONVS2S_KERNELS_DISABLE_CPP"
_SUPPORTED_DTYPES = (torch.float32, torch.float64, torch.bfloat16)

try:
    from . import _C  # type: ignore[attr-defined]

    _IMPORT_ERROR: Optional[str] = None
except ImportError as exc:  # not built, or built against another torch
    _C = None
    _IMPORT_ERROR = (
        f"the C++ extension convs2s_kernels._C could not be imported ({exc}); "
        "build it with `pip install --no-build-isolation -e .` from the repository root"
    )


def unavailable_reason() -> Optional[str]:
    if os.environ.get(DISABLE_ENV) == "1":
        return f"disabled by {DISABLE_ENV}=1"
    return _IMPORT_ERROR


set_availability("cpp", unavailable_reason)


def _dtype_and_grad_reasons(op: str, *tensors, has_backward: bool = False) -> List[str]:
    present = [t for t in tensors if isinstance(t, torch.Tensor) and t.is_floating_point()]
    why = []
    dtype = present[0].dtype
    if dtype not in _SUPPORTED_DTYPES:
        why.append(f"cpp {op} supports {', '.join(str(d) for d in _SUPPORTED_DTYPES)}, got {dtype}")
    if not has_backward and torch.is_grad_enabled() and any(t.requires_grad for t in present):
        why.append(f"cpp {op} has no backward yet; inputs require grad")
    return why


# --- conv + GLU: custom ops (so torch.compile sees through them) with an autograd formula ------
@torch.library.custom_op("convs2s::conv_glu_cpu", mutates_args=())
def _conv_glu_op(x: Tensor, weight: Tensor, bias: Optional[Tensor], residual: Optional[Tensor],
                 pad_mask: Optional[Tensor], causal: bool, scale: float) -> Tuple[Tensor, Tensor]:
    out, pre = _C.conv_glu_forward(x, weight, bias, residual, pad_mask, causal, scale)
    return out, pre


@_conv_glu_op.register_fake
def _(x, weight, bias, residual, pad_mask, causal, scale):
    B, T, _ = x.shape
    return x.new_empty(B, T, weight.shape[2] // 2), x.new_empty(B * T, weight.shape[2])


@torch.library.custom_op("convs2s::conv_glu_cpu_backward", mutates_args=())
def _conv_glu_backward_op(dout: Tensor, x: Tensor, weight: Tensor, pre: Tensor, pad_mask: Optional[Tensor],
                          causal: bool, scale: float, need_residual_grad: bool) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    dx, dw, db, dres = _C.conv_glu_backward(dout, x, weight, pre, pad_mask, causal, scale, need_residual_grad)
    return dx, dw, db, dres if dres is not None else x.new_empty(0)


@_conv_glu_backward_op.register_fake
def _(dout, x, weight, pre, pad_mask, causal, scale, need_residual_grad):
    dres = torch.empty_like(dout) if need_residual_grad else x.new_empty(0)
    return torch.empty_like(x), torch.empty_like(weight), weight.new_empty(weight.shape[2]), dres


def _conv_glu_setup(ctx, inputs, output):
    x, weight, bias, residual, pad_mask, causal, scale = inputs
    ctx.save_for_backward(x, weight, output[1], pad_mask)
    ctx.causal, ctx.scale = causal, scale
    ctx.has_bias, ctx.has_residual = bias is not None, residual is not None


def _conv_glu_backward(ctx, dout, _dpre):
    x, weight, pre, pad_mask = ctx.saved_tensors
    dx, dw, db, dres = _conv_glu_backward_op(dout.contiguous(), x, weight, pre, pad_mask, ctx.causal, ctx.scale,
                                             ctx.has_residual and ctx.needs_input_grad[3])
    return dx, dw, db if ctx.has_bias else None, dres if dres.numel() else None, None, None, None


_conv_glu_op.register_autograd(_conv_glu_backward, setup_context=_conv_glu_setup)


def _conv_glu_check(x, weight, bias=None, *, causal, residual=None, scale=None, pad_mask=None) -> List[str]:
    return _dtype_and_grad_reasons("conv_glu", x, weight, bias, residual, has_backward=True)


@register("cpp", "conv_glu", check=_conv_glu_check)
def conv_glu_cpp(x, weight, bias=None, *, causal, residual=None, scale=None, pad_mask=None):
    out, _ = _conv_glu_op(x.contiguous(), weight.contiguous(), None if bias is None else bias.contiguous(),
                          None if residual is None else residual.contiguous(),
                          None if pad_mask is None else pad_mask.contiguous(), bool(causal),
                          1.0 if scale is None else float(scale))
    return out


def _conv_step_check(x_t, state, weight, bias=None, beam_index=None) -> List[str]:
    return _dtype_and_grad_reasons("conv_step", x_t, state, weight, bias)


@register("cpp", "conv_step", check=_conv_step_check)
def conv_step_cpp(x_t, state, weight, bias=None, beam_index=None):
    out, new_state = _C.conv_step_forward(x_t, state, weight.contiguous(), bias, beam_index)
    return out, new_state


# --- attention with the embedding sum ----------------------------------------------------------
@torch.library.custom_op("convs2s::attention_embsum_cpu", mutates_args=())
def _attention_op(q: Tensor, z: Tensor, y: Tensor, src_lengths: Optional[Tensor], left_pad: bool) -> Tuple[Tensor, Tensor]:
    ctx, p_scaled = _C.attention_forward(q, z, y, src_lengths, left_pad)
    return ctx, p_scaled


@_attention_op.register_fake
def _(q, z, y, src_lengths, left_pad):
    B, T, E = q.shape
    return q.new_empty(B, T, E), q.new_empty(B, T, z.shape[1])


@torch.library.custom_op("convs2s::attention_embsum_cpu_backward", mutates_args=())
def _attention_backward_op(dctx: Tensor, q: Tensor, z: Tensor, y: Tensor, p_scaled: Tensor,
                           src_lengths: Optional[Tensor], left_pad: bool,
                           dp_scaled: Optional[Tensor]) -> Tuple[Tensor, Tensor, Tensor]:
    dq, dz, dy = _C.attention_backward(dctx, q, z, y, p_scaled, src_lengths, left_pad, dp_scaled)
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


def _attention_check(q, z, y, src_lengths=None, *, left_pad=True, return_attn=False) -> List[str]:
    return _dtype_and_grad_reasons("attention_embsum", q, z, y, has_backward=True)


@register("cpp", "attention_embsum", check=_attention_check)
def attention_embsum_cpp(q, z, y, src_lengths=None, *, left_pad=True, return_attn=False):
    ctx, p_scaled = _attention_op(q.contiguous(), z.contiguous(), y.contiguous(), src_lengths, bool(left_pad))
    if not return_attn:
        return ctx
    n = src_lengths if src_lengths is not None else torch.full((q.shape[0],), z.shape[1], device=q.device)
    return ctx, p_scaled / n.to(p_scaled.dtype).sqrt().view(-1, 1, 1)


# --- few-row linear (decoding) --------------------------------------------------------------------
def _linear_check(x, weight, bias=None) -> List[str]:
    why = []
    if x.dtype not in (torch.float32, torch.bfloat16):
        why.append(f"cpp linear takes float32 or bf16, got {x.dtype}")
    if x.dim() != 2 or not 1 <= x.shape[0] <= 8:
        why.append(f"cpp linear takes 1..8 rows of a 2-D input (decoding), got shape {tuple(x.shape)}")
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (x, weight, bias)):
        why.append("cpp linear has no backward; inputs require grad")
    return why


@register("cpp", "linear", check=_linear_check)
def linear_cpp(x, weight, bias=None):
    return _C.small_linear(x, weight, bias)


# --- weight-only int8 linear (decoding) ------------------------------------------------------------
def _linear_int8_check(x, qweight, scale, bias=None) -> List[str]:
    why = []
    if x.dtype != torch.float32 or scale.dtype != torch.float32 or (bias is not None and bias.dtype != torch.float32):
        why.append(f"cpp linear_int8 takes float32 activations, scale and bias, got x {x.dtype}")
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (x, scale, bias)):
        why.append("cpp linear_int8 has no backward; inputs require grad")
    return why


@register("cpp", "linear_int8", check=_linear_int8_check)
def linear_int8_cpp(x, qweight, scale, bias=None):
    lead = x.shape[:-1]
    y = _C.linear_int8(x.reshape(-1, x.shape[-1]), qweight, scale, bias)
    return y.view(*lead, qweight.shape[0])
