"""``attention_step``: the public function (checks its inputs, then calls the backend the dispatcher picks)."""

from __future__ import annotations

from typing import Optional

import torch

from ..._checks import check_index, check_same, check_shape, check_tensor
from ...dispatch import resolve
from .._common import autocast_inputs

__all__ = ["attention_step", "attention_step_tensors"]


def attention_step_tensors(h, emb_scores, z_bias, z_in, y_out, b_out, src_lengths, residual=None, **_):
    """The floating tensors of a call, the activation first (for the backends' capabilities)."""
    return h, emb_scores, z_bias, z_in, y_out, b_out, residual


def attention_step(h: torch.Tensor, emb_scores: torch.Tensor, z_bias: torch.Tensor, z_in: torch.Tensor,
                   y_out: torch.Tensor, b_out: torch.Tensor, src_lengths: torch.Tensor,
                   residual: Optional[torch.Tensor] = None, *, left_pad: bool = True, need_attn: bool = False,
                   backend: Optional[str] = None):
    """One decoding step of an attention layer folded into its sentence's encoder outputs (scores,
    masked softmax, context, ``sqrt(s)``, output bias, the layer's own and its residual ``sqrt(1/2)``
    sums), inference only.

    ``h (B, beam, C)``, ``emb_scores (B, beam, S)``, ``z_bias (B, S)``, ``z_in (B, S, C)``,
    ``y_out (B, S, C)``, ``b_out (C,)``, ``src_lengths (B,)`` in ``[1, S]``, ``residual (B, beam, C)``
    or None -> ``(out (B, beam, C), attn (B, beam, S) or None)``.
    See :func:`convs2s_kernels.attention_step_ref`.
    """
    check_tensor("h", h, 3)
    B, beam, C = h.shape
    check_tensor("z_in", z_in, 3)
    S = z_in.shape[1]
    if S == 0:
        raise ValueError("z_in has no source positions (S = 0)")
    check_shape("z_in", z_in, (B, S, C), "(B, S, C)")
    check_tensor("y_out", y_out, 3)
    check_shape("y_out", y_out, (B, S, C), "(B, S, C)")
    check_tensor("emb_scores", emb_scores, 3)
    check_shape("emb_scores", emb_scores, (B, beam, S), "(B, beam, S)")
    check_tensor("z_bias", z_bias, 2)
    check_shape("z_bias", z_bias, (B, S), "(B, S)")
    check_tensor("b_out", b_out, 1)
    check_shape("b_out", b_out, (C,), "(C,)")
    if residual is not None:
        check_tensor("residual", residual, 3)
        check_shape("residual", residual, (B, beam, C), "(B, beam, C)")
    h, emb_scores, z_bias, z_in, y_out, b_out, residual = autocast_inputs(
        h.device, h, emb_scores, z_bias, z_in, y_out, b_out, residual)
    check_same("h", h, emb_scores=emb_scores, z_bias=z_bias, z_in=z_in, y_out=y_out, b_out=b_out, residual=residual)
    check_index("src_lengths", src_lengths, B, h.device, low=1, high=S)
    kwargs = dict(left_pad=left_pad, need_attn=need_attn)
    fn = resolve("attention_step", h.device, backend, h, emb_scores, z_bias, z_in, y_out, b_out, src_lengths,
                 residual, **kwargs)
    return fn(h, emb_scores, z_bias, z_in, y_out, b_out, src_lengths, residual, **kwargs)
