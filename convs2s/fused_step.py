"""Every decoder layer of one decoding step in a single C++ call (``convs2s_kernels._C``).

Used by :meth:`convs2s.decoder.Decoder.forward_step` when the cpp backend may run the step:
folded attention, inference (no autograd, eval mode), CPU float32/bf16 activations, and a
backend request that allows cpp (``auto``, or a list naming ``cpp``). It runs the same
operations through the same kernels as the Python loop, so the outputs are the same; what it
removes is Python's per-operation overhead (about a hundred calls per step).
"""

from __future__ import annotations

from typing import List, Optional, Tuple

import torch

import convs2s_kernels as ck


def fused_step_reason(decoder, x: torch.Tensor, state, backend: Optional[str]) -> Optional[str]:
    """Why the one-call step cannot run here (None when it can)."""
    if not getattr(decoder, "fused_step", True):
        return "turned off (decoder.fused_step = False)"
    if state.folded is None:
        return "needs the folded attention (fold_attention=True)"
    if decoder.training or torch.is_grad_enabled():
        return "inference only (eval mode under torch.no_grad)"
    if x.device.type != "cpu" or x.dtype not in (torch.float32, torch.bfloat16):
        return f"runs float32/bf16 CPU tensors, got {x.dtype} on {x.device.type}"
    why = ck.available_backends()["cpp"]
    if why is not None:
        return why
    choices = ck.dispatch.requested_backends(backend)
    if "auto" not in choices and "cpp" not in choices:
        return f"backend {backend!r} does not allow cpp"
    return None


def _weights(layer) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    quantized = layer.int8_weight()
    if quantized is not None:
        return quantized
    return layer.effective_weight().contiguous(), None


def _pack(decoder) -> dict:
    """The layers' weights in the extension's argument order (once per decoder state)."""
    conv_w, conv_scale, conv_b, proj_w, proj_scale, proj_b = [], [], [], [], [], []
    for proj, conv in zip(decoder.projections, decoder.convolutions):
        w, s = _weights(conv)
        conv_w.append(w)
        conv_scale.append(s)
        conv_b.append(conv.bias)
        if proj is None:
            proj_w.append(None)
            proj_scale.append(None)
            proj_b.append(None)
        else:
            w, s = _weights(proj)
            proj_w.append(w)
            proj_scale.append(s)
            proj_b.append(proj.bias)
    return dict(conv_w=conv_w, conv_scale=conv_scale, conv_b=conv_b, residual=list(decoder.residuals),
                proj_w=proj_w, proj_scale=proj_scale, proj_b=proj_b)


def fused_layers_step(decoder, x: torch.Tensor, emb_scores: torch.Tensor, state, parents: Optional[torch.Tensor],
                      need_attn: bool) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """``(x after the last layer (N, C), averaged attention (N, S) or None)``; advances the conv states."""
    if state.fused_weights is None:
        state.fused_weights = _pack(decoder)
    p = state.fused_weights
    folded: List = state.folded
    enc = state.encoder_out
    ck.dispatch.note_dispatch("decoder_layers_step", "cpp")
    out = ck._cpp._C.decoder_layers_step(
        x, emb_scores, state.conv_states, parents, p["conv_w"], p["conv_scale"], p["conv_b"], p["residual"],
        p["proj_w"], p["proj_scale"], p["proj_b"],
        [f.z_in if f is not None else None for f in folded], [f.z_bias if f is not None else None for f in folded],
        [f.y_out if f is not None else None for f in folded], [f.b_out if f is not None else None for f in folded],
        enc.pad_mask, enc.src_lengths.to(x.dtype).sqrt(), need_attn)
    state.conv_states = list(out[2:])
    return out[0], out[1]
