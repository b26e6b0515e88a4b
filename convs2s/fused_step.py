"""Every decoder layer of one decoding step in a single call: ``convs2s_kernels.decoder_step``.

Used by :meth:`convs2s.decoder.Decoder.forward_step` when the op's cpp backend may run the step:
folded attention, inference (no autograd, eval mode), CPU float32/bf16 activations, and a
backend request that allows cpp (``auto``, or a list naming ``cpp``). It runs the same
operations through the same kernels as the Python loop, so the outputs are the same; what it
removes is Python's per-operation overhead (about a hundred calls per step).
"""

from __future__ import annotations

from typing import List, Optional, Tuple

import torch

import convs2s_kernels as ck


def fused_step_reason(decoder, x: torch.Tensor, emb_scores: torch.Tensor, state,
                      backend: Optional[str]) -> Optional[str]:
    """Why the one-call step cannot run here (None when it can): the model's own conditions, then
    what the op's cpp capability refuses (availability, device, dtype)."""
    if not getattr(decoder, "fused_step", True):
        return "turned off (decoder.fused_step = False)"
    if state.folded is None:
        return "needs the folded attention (fold_attention=True)"
    if decoder.training or torch.is_grad_enabled():
        return "inference only (eval mode under torch.no_grad)"
    choices = ck.requested_backends(backend)
    if "auto" not in choices and "cpp" not in choices:
        return f"backend {backend!r} does not allow cpp"
    enc = state.encoder_out
    why = ck.backend_reasons("cpp", "decoder_step", x.device, x, state.conv_states, _step_layers(decoder, state),
                             emb_scores, enc.pad_mask, enc.src_lengths)
    return "; ".join(why) or None


def _weights(layer) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    quantized = layer.int8_weight()
    if quantized is not None:
        return quantized
    return layer.effective_weight().contiguous(), None


def _layer_weights(decoder) -> List[dict]:
    """Each layer's conv, residual and projection weights (once per decoder state)."""
    layers = []
    for proj, conv, r in zip(decoder.projections, decoder.convolutions, decoder.residuals):
        conv_w, conv_s = _weights(conv)
        entry = dict(conv_weight=conv_w, conv_scale=conv_s, conv_bias=conv.bias, residual=r)
        if proj is not None:
            proj_w, proj_s = _weights(proj)
            entry.update(proj_weight=proj_w, proj_scale=proj_s, proj_bias=proj.bias)
        layers.append(entry)
    return layers


def _step_layers(decoder, state) -> List[ck.StepLayer]:
    if state.fused_weights is None:
        state.fused_weights = _layer_weights(decoder)
    return [ck.StepLayer(**w, attention=None if f is None else ck.StepAttention(f.z_in, f.z_bias, f.y_out, f.b_out))
            for w, f in zip(state.fused_weights, state.folded)]


def fused_layers_step(decoder, x: torch.Tensor, emb_scores: torch.Tensor, state, parents: Optional[torch.Tensor],
                      need_attn: bool) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """``(x after the last layer (N, C), averaged attention (N, S) or None)``; advances the conv states."""
    enc = state.encoder_out
    x, attn, state.conv_states = ck.decoder_step(
        x, state.conv_states, _step_layers(decoder, state), emb_scores, enc.pad_mask, enc.src_lengths, parents,
        need_attn=need_attn, backend="cpp")
    return x, attn
