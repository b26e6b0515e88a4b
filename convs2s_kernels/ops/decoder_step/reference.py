"""The ground truth of ``decoder_step``: every layer of one decoding step, as a Python loop over
the other ops' references (the decoder's own loop, with the attention folded)."""

from __future__ import annotations

import math
from typing import List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F

from ..conv_step.reference import conv_step_ref
from ..linear_int8.reference import linear_int8_ref
from ..linear_w8a8.reference import linear_w8a8_ref
from .layers import StepLayer

__all__ = ["decoder_step_ref"]

SQRT_HALF = math.sqrt(0.5)


def _linear(x, weight, scale, bias, layer: StepLayer):
    if scale is None:
        return F.linear(x, weight, bias)
    if layer.int8_activations:
        return linear_w8a8_ref(x, weight, scale, bias, activation_bits=layer.activation_bits)
    return linear_int8_ref(x, weight, scale, bias)


def _conv(x, state, layer: StepLayer, beam_index):
    if layer.conv_scale is None:
        return conv_step_ref(x, state, layer.conv_weight, layer.conv_bias, beam_index)
    if beam_index is not None:  # int8 rows (2C, k*C_in): the same gather, shift and append
        state = state.index_select(0, beam_index)
    window = torch.cat([state, x.unsqueeze(1)], dim=1)
    pre = _linear(window.flatten(1), layer.conv_weight, layer.conv_scale, layer.conv_bias, layer)
    return F.glu(pre, dim=-1), window[:, 1:]


def _attend(h, layer: StepLayer, emb_scores, pad_mask, length_scale):
    """Folded attention (``convs2s.decoder.FoldedAttention.step``): ``h (B, beam, C)``."""
    a = layer.attention
    scores = torch.baddbmm(emb_scores + a.z_bias.unsqueeze(1), h, a.z_in.transpose(1, 2)) * SQRT_HALF
    scores = scores.to(torch.promote_types(scores.dtype, torch.float32))
    attn = torch.softmax(scores.masked_fill(pad_mask.unsqueeze(1), float("-inf")), dim=-1).to(h.dtype)
    return (torch.bmm(attn * length_scale, a.y_out) + a.b_out + h) * SQRT_HALF, attn


def decoder_step_ref(x: torch.Tensor, states: Sequence[torch.Tensor], layers: Sequence[StepLayer],
                     emb_scores: torch.Tensor, pad_mask: torch.Tensor, src_lengths: torch.Tensor,
                     beam_index: Optional[torch.Tensor] = None, *, need_attn: bool = False,
                     ) -> Tuple[torch.Tensor, Optional[torch.Tensor], List[torch.Tensor]]:
    """Run every layer of one step: residual (projected), conv step + GLU, folded attention, sum.

    Shapes: ``x (N, C_0)`` the embedded input after ``fc1`` (``N = B * beam``, a sentence's beams
    adjacent), ``states[i] (N_prev, k_i - 1, C_in_i)``, ``emb_scores (B, beam, S)`` the target
    embeddings' scores ``g . z_s``, ``pad_mask (B, S)`` True at source padding, ``src_lengths (B,)``,
    ``beam_index (N,)`` the parent row of each new row. Returns ``(x (N, C_L), attention averaged
    over the layers (N, S) or None, new states)``; ``states`` are not modified.
    """
    B, beam = emb_scores.shape[:2]
    length_scale = src_lengths.to(x.dtype).sqrt().view(-1, 1, 1)
    residuals, new_states, attn_sum = [x], [], None
    for layer, state in zip(layers, states):
        res = None
        if layer.residual > 0:
            res = residuals[-layer.residual]
            if layer.proj_weight is not None:
                res = _linear(res, layer.proj_weight, layer.proj_scale, layer.proj_bias, layer)
        x, new_state = _conv(x, state, layer, beam_index)
        new_states.append(new_state)
        if layer.attention is not None:
            out, attn = _attend(x.view(B, beam, -1), layer, emb_scores, pad_mask, length_scale)
            x = out.reshape(B * beam, -1)
            if need_attn:
                a = attn.reshape(B * beam, -1) / len(layers)
                attn_sum = a if attn_sum is None else attn_sum + a
        if res is not None:
            x = (x + res) * SQRT_HALF
        residuals.append(x)
    return x, attn_sum, new_states
