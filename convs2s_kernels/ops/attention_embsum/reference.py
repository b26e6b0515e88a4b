"""The ground truth of ``attention_embsum``: ConvS2S attention with the embedding sum in plain PyTorch.
"""

from __future__ import annotations

import math
from typing import Optional

import torch
__all__ = ["source_key_mask", "attention_embsum_ref"]


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
