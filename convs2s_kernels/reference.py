"""Pure-PyTorch references of the three fused ConvS2S computations.

These are the ground truth every other backend is tested against, and the last
fallback of the dispatcher. They favour clarity over speed and support autograd.

Layout is batch-major ``(B, T, C)`` everywhere. Convolution weights use the
layout fairseq's ``ConvTBC`` stores, ``(k, C_in, 2C)``: tap ``j = k-1`` multiplies
the newest input. Viewed as ``(k*C_in, 2C)`` the same memory is the matrix of the
"linearised" convolution, so one step of decoding is ``window.view(N, k*C_in) @ W``.
GLU takes the first ``C`` output channels as values and the last ``C`` as gates.
"""

from __future__ import annotations

import math
from typing import Optional, Tuple

import torch
import torch.nn.functional as F

__all__ = [
    "conv_padding",
    "conv_glu_ref",
    "attention_embsum_ref",
    "conv_step_ref",
    "source_key_mask",
    "quantize_int8",
    "linear_int8_ref",
]


def conv_padding(kernel_width: int, causal: bool) -> Tuple[int, int]:
    """(left, right) zero padding along time.

    Causal: ``k-1`` on the left, so output ``t`` sees inputs ``<= t``.
    Centred: ``(k-1)//2`` left and ``k//2`` right, fairseq's rule that also covers even ``k``.
    """
    if causal:
        return kernel_width - 1, 0
    return (kernel_width - 1) // 2, kernel_width // 2


def conv_glu_ref(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: Optional[torch.Tensor] = None,
    *,
    causal: bool,
    residual: Optional[torch.Tensor] = None,
    scale: Optional[float] = None,
    pad_mask: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """Convolution of width k to 2C channels, GLU, then optionally ``(out + residual) * scale``.

    Shapes: ``x (B, T, C_in)``, ``weight (k, C_in, 2C)``, ``bias (2C,)``,
    ``residual (B, T, C)``, ``pad_mask (B, T)`` bool, True where the input is padding
    (those input steps are zeroed before the convolution, as fairseq's encoder does).
    Returns ``(B, T, C)``.

    PyTorch equivalent (channels-first)::

        F.glu(F.conv1d(F.pad(x.mT, conv_padding(k, causal)), weight.permute(2, 1, 0), bias), dim=1).mT
    """
    k = weight.shape[0]
    if pad_mask is not None:
        x = x.masked_fill(pad_mask.unsqueeze(-1), 0.0)
    left, right = conv_padding(k, causal)
    pre = F.conv1d(F.pad(x.transpose(1, 2), (left, right)), weight.permute(2, 1, 0), bias)
    out = F.glu(pre, dim=1).transpose(1, 2)
    if residual is not None:
        out = out + residual
    if scale is not None:
        out = out * scale
    return out


def source_key_mask(src_lengths: torch.Tensor, src_len: int, left_pad: bool = True) -> torch.Tensor:
    """(B, S) bool mask, True at padding, for rows of true length ``src_lengths``.

    Left padding (fairseq's source convention) puts the valid steps at the end.
    """
    pos = torch.arange(src_len, device=src_lengths.device)
    lengths = src_lengths.to(pos.dtype).unsqueeze(1)
    if left_pad:
        return pos.unsqueeze(0) < (src_len - lengths)
    return pos.unsqueeze(0) >= lengths


def attention_embsum_ref(
    q: torch.Tensor,
    z: torch.Tensor,
    y: torch.Tensor,
    src_lengths: Optional[torch.Tensor] = None,
    *,
    left_pad: bool = True,
    return_attn: bool = False,
):
    """ConvS2S attention with the embedding sum: ``c = sqrt(s) * softmax(q z^T) y``.

    Shapes: ``q (B, T, E)`` the decoder queries ``d = (W h + b + g) * sqrt(1/2)``,
    ``z (B, S, E)`` the encoder outputs (keys), ``y (B, S, E)`` the values
    ``(z + e) * sqrt(1/2)`` precomputed by the encoder, ``src_lengths (B,)`` the true source
    lengths (EOS included); ``None`` means no padding. With ``left_pad`` the valid steps are
    the last ``s`` of each row, otherwise the first ``s``.

    The context is scaled by ``s * sqrt(1/s) = sqrt(s)`` per row (the paper's ``m sqrt(1/m)``).
    Returns ``c (B, T, E)``, and ``attn (B, T, S)`` when ``return_attn``.

    PyTorch equivalent::

        a = (q @ z.mT).masked_fill(pad[:, None], -inf).softmax(-1); c = (a @ y) * s.sqrt()[:, None, None]
    """
    src_len = z.shape[1]
    # Softmax statistics in at least float32 (fairseq masks in float32 as an fp16 guard).
    acc_dtype = torch.promote_types(q.dtype, torch.float32)
    scores = torch.bmm(q, z.transpose(1, 2)).to(acc_dtype)
    if src_lengths is None:
        scale = torch.full((q.shape[0], 1, 1), math.sqrt(src_len), dtype=q.dtype, device=q.device)
    else:
        pad = source_key_mask(src_lengths, src_len, left_pad)
        scores = scores.masked_fill(pad.unsqueeze(1), float("-inf"))
        scale = src_lengths.to(q.dtype).sqrt().view(-1, 1, 1)
    attn = torch.softmax(scores, dim=-1).to(q.dtype)
    context = torch.bmm(attn, y) * scale
    if return_attn:
        return context, attn
    return context


def conv_step_ref(
    x_t: torch.Tensor,
    state: torch.Tensor,
    weight: torch.Tensor,
    bias: Optional[torch.Tensor] = None,
    beam_index: Optional[torch.Tensor] = None,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """One step of the causal convolution + GLU with its input FIFO.

    Shapes: ``x_t (N, C_in)`` the new input of each row, ``state (N_prev, k-1, C_in)`` the
    last ``k-1`` inputs (oldest first; zeros before the first step), ``weight (k, C_in, 2C)``,
    ``bias (2C,)``, ``beam_index (N,)`` int64, the parent row in ``state`` of each new row
    (rows may share a parent; ``None`` keeps the order and needs ``N_prev == N``).

    Returns ``(out (N, C), new_state (N, k-1, C_in))``; ``state`` is not modified.

    PyTorch equivalent::

        window = torch.cat([state[beam_index], x_t[:, None]], 1)
        out = F.glu(window.flatten(1) @ weight.flatten(0, 1) + bias, dim=-1); new_state = window[:, 1:]
    """
    if beam_index is not None:
        state = state.index_select(0, beam_index)
    window = torch.cat([state, x_t.unsqueeze(1)], dim=1)
    k, c_in, c2 = weight.shape
    pre = window.reshape(window.shape[0], k * c_in) @ weight.reshape(k * c_in, c2)
    if bias is not None:
        pre = pre + bias
    return F.glu(pre, dim=-1), window[:, 1:].clone()


def quantize_int8(weight: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """Symmetric int8 quantisation per output row: ``weight (N, K) ~ qweight * scale[:, None]``.

    ``scale = max|w_n| / 127`` (rows of zeros get scale 1), ``qweight = round(w / scale)`` in
    ``[-127, 127]``; returns ``(qweight int8 (N, K), scale float32 (N,))``. The error of each
    weight is at most ``scale / 2``.
    """
    w = weight.detach().float()
    scale = w.abs().amax(dim=1) / 127.0
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    # contiguous rows whatever w's layout (a transposed conv weight): the kernels stream them
    qweight = torch.round(w / scale.unsqueeze(1)).clamp_(-127, 127).to(torch.int8).contiguous()
    return qweight, scale.contiguous()


def linear_int8_ref(x: torch.Tensor, qweight: torch.Tensor, scale: torch.Tensor,
                    bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``x @ (qweight * scale[:, None]).T + bias``: a linear layer with int8 weights (dequantised here).

    Shapes: ``x (..., K)`` floating, ``qweight (N, K)`` int8, ``scale (N,)``, ``bias (N,)``.
    """
    w = qweight.to(x.dtype) * scale.to(x.dtype).unsqueeze(1)
    return F.linear(x, w, None if bias is None else bias.to(x.dtype))
