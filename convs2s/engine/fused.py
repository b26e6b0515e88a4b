"""Every decoder layer of one decoding step in a single call: ``convs2s_kernels.decoder_step``.

Used by :func:`convs2s.engine.step.decode_step` when the op's cpp backend may run the step:
folded attention, inference (no autograd, eval mode), CPU float32/bf16 activations, and a
backend request that allows cpp (``auto``, or a list naming ``cpp``). It runs the same
operations through the same kernels as the Python loop (the float32 folded attention through the
few-row kernels and a softmax loop of its own), so the outputs are the same up to float rounding;
what it removes is Python's per-operation overhead (about a hundred calls per step).
"""

from __future__ import annotations

from typing import List, Optional, Tuple

import torch

import convs2s_kernels as ck

from ..layers import Linear
from .weights import linear


def fused_step_reason(prepared, x: torch.Tensor, emb_scores: torch.Tensor, state) -> Optional[str]:
    """Why the one-call step cannot run here (None when it can): the prepared model's own
    conditions, then what the op's cpp capability refuses (availability, device, dtype)."""
    decoder, backend = prepared.model.decoder, prepared.backend
    if not prepared.fused_step:
        return "turned off (PreparedModel.fused_step = False)"
    if state.folded is None:
        return "needs the folded attention (fold_attention=True)"
    if decoder.training or torch.is_grad_enabled():
        return "inference only (eval mode under torch.no_grad)"
    if torch.is_autocast_enabled(x.device.type):
        return "under autocast (the one-call step runs in the weights' dtype; the per-op step casts as autocast does)"
    choices = ck.requested_backends(backend)
    if "auto" not in choices and "cpp" not in choices:
        return f"backend {backend!r} does not allow cpp"
    enc = state.encoder_out
    why = ck.backend_reasons("cpp", "decoder_step", x.device, x, state.conv_states, _step_layers(prepared, state),
                             emb_scores, enc.pad_mask, enc.src_lengths)
    return "; ".join(why) or None


def _weights(layer) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    quantized = layer.int8_weight()
    if quantized is not None:
        return quantized
    return layer.weight().contiguous(), None


def _layer_weights(prepared) -> List[dict]:
    """Each layer's conv, residual and projection weights (once per decoder state)."""
    decoder, layers = prepared.model.decoder, []
    for proj, conv, r in zip(decoder.projections, decoder.convolutions, decoder.residuals):
        proj, conv = prepared.derived(proj), prepared.derived(conv)
        conv_w, conv_s = _weights(conv)
        entry = dict(conv_weight=conv_w, conv_scale=conv_s, conv_bias=conv.bias, residual=r,
                     int8_activations=conv_s is not None and conv.int8_activations,
                     activation_bits=conv.int8_activation_bits, weight_bits=conv.int8_weight_bits,
                     conv_packed=conv.int8_extra().get("packed") if conv_s is not None else conv.step_packed())
        if proj is not None:
            proj_w, proj_s = _weights(proj)
            if proj_s is not None and (conv_s is None or proj.int8_activations != conv.int8_activations
                                       or proj.int8_activation_bits != conv.int8_activation_bits
                                       or proj.int8_weight_bits != conv.int8_weight_bits):
                raise ValueError("the one-call step takes one int8 setting per layer: quantise the projection and "
                                 "the convolution alike (convs2s.engine.quantize_decoder_int8)")
            entry.update(proj_weight=proj_w, proj_scale=proj_s, proj_bias=proj.bias,
                         proj_packed=proj.int8_extra().get("packed") if proj_s is not None else proj.step_packed())
        layers.append(entry)
    return layers


def _step_layers(prepared, state) -> List[ck.StepLayer]:
    """The layers' weights and this state's folded attention (rebuilt when sentences leave)."""
    data = state.fused
    if data.weights is None:
        data.weights = _layer_weights(prepared)
    key = tuple(None if f is None else id(f.z_in) for f in state.folded)
    if data.layers is None or data.layers[0] != key:
        layers = [ck.StepLayer(**w, attention=None if f is None else ck.StepAttention(f.z_in, f.z_bias, f.y_out,
                                                                                       f.b_out))
                  for w, f in zip(data.weights, state.folded)]
        data.layers = (key, layers)
    return data.layers[1]


def fused_layers_step(prepared, x: torch.Tensor, emb_scores: torch.Tensor, state, parents: Optional[torch.Tensor],
                      need_attn: bool) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """``(x after the last layer (N, C), averaged attention (N, S) or None)``; advances the conv states.

    The op's checks run at the first step with each row count (sentences leaving change it);
    later steps call the cpp implementation chosen then (``state.calls``)."""
    enc = state.encoder_out
    x, attn, state.conv_states = state.calls(
        ck.decoder_step, x.shape[0], x.device, x, state.conv_states, _step_layers(prepared, state), emb_scores,
        enc.pad_mask, enc.src_lengths, parents, need_attn=need_attn, backend="cpp")
    return x, attn


def step_linear(state, name: str, prepared, module, x: torch.Tensor) -> torch.Tensor:
    """``module``'s product for a decoding step (``name``: the decoder's layer): in inference (no
    autograd, no autocast) through ``state.calls``, the op's checks run at the first step with
    each row count; otherwise the product itself (:func:`convs2s.engine.weights.linear`)."""
    backend, d = prepared.backend, prepared.derived(module)
    if (not isinstance(module, Linear) or torch.is_grad_enabled() or module.training
            or torch.is_autocast_enabled(x.device.type)):
        return linear(d, module, x, backend)
    quantized = d.int8_weight()
    if quantized is not None:
        return state.calls(d.int8_product(), (name, x.shape[0]), x.device, x, *quantized, module.bias,
                           backend=backend, **d.int8_extra())
    choices = ck.requested_backends(backend)
    packed = d.step_packed() if "auto" in choices or "cpp" in choices else None  # only cpp reads it
    return state.calls(ck.linear, (name, x.shape[0]), x.device, x, d.weight(), module.bias,
                       backend=backend, packed=packed)
