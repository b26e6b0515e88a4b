"""The ground truth of ``attention_step``: one decoding step of a folded attention layer in plain PyTorch."""

from __future__ import annotations

import math
from typing import Optional

import torch

from ..attention_embsum.reference import source_key_mask

__all__ = ["attention_step_ref"]

SQRT_HALF = math.sqrt(0.5)


def attention_step_ref(h: torch.Tensor, emb_scores: torch.Tensor, z_bias: torch.Tensor, z_in: torch.Tensor,
                       y_out: torch.Tensor, b_out: torch.Tensor, src_lengths: torch.Tensor,
                       residual: Optional[torch.Tensor] = None, *, left_pad: bool = True, need_attn: bool = False):
    """One step of a decoder attention layer folded into its sentence's encoder outputs, with the
    layer's residual connection.

    ``h (B, beam, C)`` the conv step's output, ``emb_scores (B, beam, S)`` the target embeddings'
    scores ``g . z``, ``z_bias (B, S) = z . b_in``, ``z_in (B, S, C) = z W_in``, ``y_out (B, S, C) =
    y W_out^T``, ``b_out (C,)``, ``src_lengths (B,)`` in ``[1, S]`` (valid steps last with
    ``left_pad``), ``residual (B, beam, C)`` or None -> ``(out (B, beam, C), attn (B, beam, S) or None)``.

    PyTorch equivalent (the softmax in at least float32)::

        scores = sqrt(1/2) (h @ z_in.mT + emb_scores + z_bias[:, None])       # masked at padding
        attn = softmax(scores); out = sqrt(1/2) (sqrt(s) attn @ y_out + b_out + h)
        out = sqrt(1/2) (out + residual)                                          # with a residual
    """
    scores = (torch.baddbmm(emb_scores + z_bias.unsqueeze(1), h, z_in.transpose(1, 2))) * SQRT_HALF
    acc = torch.promote_types(scores.dtype, torch.float32)
    pad = source_key_mask(src_lengths, z_in.shape[1], left_pad)
    scores = scores.to(acc).masked_fill(pad.unsqueeze(1), float("-inf"))
    attn = torch.softmax(scores, dim=-1).to(h.dtype)
    scale = src_lengths.to(h.dtype).sqrt().view(-1, 1, 1)
    out = (torch.bmm(attn * scale, y_out) + b_out + h) * SQRT_HALF
    if residual is not None:
        out = (out + residual) * SQRT_HALF
    return out, (attn if need_attn else None)
