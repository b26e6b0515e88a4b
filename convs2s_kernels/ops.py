"""The public fused ops: validate inputs, then call the backend the dispatcher picks.

Each op's semantics are those of its reference in :mod:`convs2s_kernels.reference`
(same name without ``_ref``); read the reference's docstring for the exact contract.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch

from . import reference
from ._checks import check_index, check_same, check_shape, check_tensor
from .dispatch import register, resolve

__all__ = ["conv_glu", "attention_embsum", "conv_step", "linear", "linear_int8"]

# The reference backend implements everything, for every device and dtype, with autograd.
register("reference", "conv_glu")(reference.conv_glu_ref)
register("reference", "attention_embsum")(reference.attention_embsum_ref)
register("reference", "conv_step")(reference.conv_step_ref)
register("reference", "linear")(torch.nn.functional.linear)
register("reference", "linear_int8")(reference.linear_int8_ref)


def _autocast_inputs(device: torch.device, *tensors):
    """Under ``torch.autocast``, bring the floating inputs to the autocast dtype, as autocast does
    for PyTorch's own convolutions and matmuls (the ops then see one dtype, and the reference's
    softmax still runs in float32)."""
    if not torch.is_autocast_enabled(device.type):
        return tensors
    dtype = torch.get_autocast_dtype(device.type)
    return tuple(t.to(dtype) if t is not None and t.is_floating_point() else t for t in tensors)


def _check_conv_weight(x_name: str, c_in: int, weight, bias) -> int:
    check_tensor("weight", weight, 3)
    k, w_in, c2 = weight.shape
    if k < 1 or c2 % 2:
        raise ValueError(f"weight must have shape (k >= 1, C_in, 2C) with an even last dimension, got {tuple(weight.shape)}")
    if w_in != c_in:
        raise ValueError(f"weight expects C_in = {w_in} input channels but {x_name} has {c_in}")
    if bias is not None:
        check_tensor("bias", bias, 1)
        check_shape("bias", bias, (c2,), "(2C,)")
    return c2 // 2


def conv_glu(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: Optional[torch.Tensor] = None,
    *,
    causal: bool,
    residual: Optional[torch.Tensor] = None,
    scale: Optional[float] = None,
    pad_mask: Optional[torch.Tensor] = None,
    backend: Optional[str] = None,
) -> torch.Tensor:
    """Convolution (causal or centred) + GLU, with bias, residual and scale fused.

    ``x (B, T, C_in)``, ``weight (k, C_in, 2C)``, ``bias (2C,)``, ``residual (B, T, C)``,
    ``pad_mask (B, T)`` bool (True = padding, zeroed before the convolution) -> ``(B, T, C)``.
    Equivalent: ``(F.glu(conv1d(pad(x)), dim=-1) + residual) * scale``; see
    :func:`convs2s_kernels.reference.conv_glu_ref`.
    """
    check_tensor("x", x, 3)
    c_out = _check_conv_weight("x", x.shape[2], weight, bias)
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
    x, weight, bias, residual = _autocast_inputs(x.device, x, weight, bias, residual)
    check_same("x", x, weight=weight, bias=bias, residual=residual)
    kwargs = dict(causal=causal, residual=residual, scale=scale, pad_mask=pad_mask)
    fn = resolve("conv_glu", x.device, backend, x, weight, bias, **kwargs)
    return fn(x, weight, bias, **kwargs)


def attention_embsum(
    q: torch.Tensor,
    z: torch.Tensor,
    y: torch.Tensor,
    src_lengths: Optional[torch.Tensor] = None,
    *,
    left_pad: bool = True,
    return_attn: bool = False,
    backend: Optional[str] = None,
):
    """Attention over source positions with values ``z + e`` and the ``sqrt(s)`` scale.

    ``q (B, T, E)``, ``z (B, S, E)``, ``y (B, S, E)``, ``src_lengths (B,)`` true lengths in
    ``[1, S]`` (None: no padding) -> ``context (B, T, E)`` [and ``attn (B, T, S)``].
    See :func:`convs2s_kernels.reference.attention_embsum_ref`.
    """
    check_tensor("q", q, 3)
    check_tensor("z", z, 3)
    check_tensor("y", y, 3)
    B, _, E = q.shape
    S = z.shape[1]
    check_shape("z", z, (B, None, E), "(B, S, E)")
    check_shape("y", y, (B, S, E), "(B, S, E)")
    if S == 0:
        raise ValueError("z has no source positions (S = 0)")
    q, z, y = _autocast_inputs(q.device, q, z, y)
    check_same("q", q, z=z, y=y)
    if src_lengths is not None:
        check_index("src_lengths", src_lengths, B, q.device, low=1, high=S)
    kwargs = dict(left_pad=left_pad, return_attn=return_attn)
    fn = resolve("attention_embsum", q.device, backend, q, z, y, src_lengths, **kwargs)
    return fn(q, z, y, src_lengths, **kwargs)


def conv_step(
    x_t: torch.Tensor,
    state: torch.Tensor,
    weight: torch.Tensor,
    bias: Optional[torch.Tensor] = None,
    beam_index: Optional[torch.Tensor] = None,
    *,
    backend: Optional[str] = None,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """One incremental step: reorder ``state`` by ``beam_index``, shift, append ``x_t``, conv + GLU.

    ``x_t (N, C_in)``, ``state (N_prev, k-1, C_in)``, ``weight (k, C_in, 2C)``, ``bias (2C,)``,
    ``beam_index (N,)`` parent rows in ``[0, N_prev)`` -> ``(out (N, C), new_state (N, k-1, C_in))``.
    The input state is never modified (parents may repeat). See
    :func:`convs2s_kernels.reference.conv_step_ref`.
    """
    check_tensor("x_t", x_t, 2)
    check_tensor("state", state, 3)
    N, c_in = x_t.shape
    _check_conv_weight("x_t", c_in, weight, bias)
    k = weight.shape[0]
    check_shape("state", state, (None, k - 1, c_in), "(N_prev, k-1, C_in)")
    x_t, state, weight, bias = _autocast_inputs(x_t.device, x_t, state, weight, bias)
    check_same("x_t", x_t, state=state, weight=weight, bias=bias)
    if beam_index is None:
        if state.shape[0] != N:
            raise ValueError(f"state has {state.shape[0]} rows but x_t has {N}; pass beam_index to map them")
    else:
        check_index("beam_index", beam_index, N, x_t.device, low=0, high=state.shape[0] - 1)
    fn = resolve("conv_step", x_t.device, backend, x_t, state, weight, bias, beam_index)
    return fn(x_t, state, weight, bias, beam_index)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None, *,
           backend: Optional[str] = None) -> torch.Tensor:
    """``x @ weight.T + bias``: the decoder step's projections, where only a few rows (one per
    sentence x beam) meet a large weight. ``x (..., K)``, ``weight (N, K)``, ``bias (N,)``.
    Equivalent: ``F.linear(x, weight, bias)``."""
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
    x, weight, bias = _autocast_inputs(x.device, x, weight, bias)
    check_same("x", x, weight=weight, bias=bias)
    fn = resolve("linear", x.device, backend, x, weight, bias)
    return fn(x, weight, bias)


def linear_int8(x: torch.Tensor, qweight: torch.Tensor, scale: torch.Tensor, bias: Optional[torch.Tensor] = None,
                *, backend: Optional[str] = None) -> torch.Tensor:
    """``x @ (qweight * scale[:, None]).T + bias``: weight-only int8 for the decoding step, where
    streaming the weights bounds the time (a quarter of float32's bytes; activations and sums stay
    in ``x``'s dtype). ``x (..., K)``, ``qweight (N, K)`` int8 and ``scale (N,)`` from
    :func:`convs2s_kernels.reference.quantize_int8`, ``bias (N,)``. See ``linear_int8_ref``."""
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
    fn = resolve("linear_int8", x.device, backend, x, qweight, scale, bias)
    return fn(x, qweight, scale, bias)
