"""Every decoder layer of one decoding step in a single call: ``convs2s_kernels.decoder_step``.

Used by :meth:`convs2s.decoder.Decoder.forward_step` when the op's cpp backend may run the step:
folded attention, inference (no autograd, eval mode), CPU float32/bf16 activations, and a
backend request that allows cpp (``auto``, or a list naming ``cpp``). It runs the same
operations through the same kernels as the Python loop, so the outputs are the same; what it
removes is Python's per-operation overhead (about a hundred calls per step).
"""

from __future__ import annotations

from typing import Callable, List, Optional, Tuple

import torch

import convs2s_kernels as ck
from convs2s_kernels.dispatch import bind

from .layers import Linear, apply_linear


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
    """The layers' weights and this state's folded attention (rebuilt when sentences leave)."""
    if state.fused_weights is None:
        state.fused_weights = _layer_weights(decoder)
    key = tuple(None if f is None else id(f.z_in) for f in state.folded)
    if state.fused_layers is None or state.fused_layers[0] != key:
        layers = [ck.StepLayer(**w, attention=None if f is None else ck.StepAttention(f.z_in, f.z_bias, f.y_out,
                                                                                       f.b_out))
                  for w, f in zip(state.fused_weights, state.folded)]
        state.fused_layers = (key, layers)
    return state.fused_layers[1]


def fused_layers_step(decoder, x: torch.Tensor, emb_scores: torch.Tensor, state, parents: Optional[torch.Tensor],
                      need_attn: bool) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """``(x after the last layer (N, C), averaged attention (N, S) or None)``; advances the conv states.

    The op's checks run at a state's first step (and after sentences leave); later steps call the
    cpp implementation the dispatcher chose then, with the same weights and shapes."""
    enc = state.encoder_out
    layers = _step_layers(decoder, state)
    args = (x, state.conv_states, layers, emb_scores, enc.pad_mask, enc.src_lengths, parents)
    rows_key = (x.shape[0], id(layers))
    if state.fused_call is None or state.fused_call[0] != rows_key:
        x, attn, state.conv_states = ck.decoder_step(*args, need_attn=need_attn, backend="cpp")
        state.fused_call = (rows_key, bind("decoder_step", x.device, "cpp", *args, need_attn=need_attn))
        return x, attn
    x, attn, state.conv_states = state.fused_call[1](*args, need_attn=need_attn)
    return x, attn


def _bind_linear(module, x: torch.Tensor, backend: Optional[str]) -> Callable[[torch.Tensor], torch.Tensor]:
    """``module``'s product with its weights taken once and the backend the dispatcher picks for
    ``x``: what ``apply_linear`` does per call, less its checks and dispatch (~15 us a call)."""
    if not isinstance(module, Linear):  # fairseq's tied output layer: a plain nn.Linear
        return module
    bias, quantized = module.bias, module.int8_weight()
    if quantized is not None:
        fn = bind("linear_int8", x.device, backend, x, *quantized, bias)
        return lambda rows: fn(rows, *quantized, bias)
    weight = module.effective_weight()
    fn = bind("linear", x.device, backend, x, weight, bias)
    return lambda rows: fn(rows, weight, bias)


def step_linear(state, name: str, module, x: torch.Tensor, backend: Optional[str]) -> torch.Tensor:
    """``apply_linear(module, x, backend)`` for a decoding step: in inference (no autograd, no
    autocast) bound once per state and row count (:func:`_bind_linear`); otherwise the op itself."""
    if torch.is_grad_enabled() or module.training or torch.is_autocast_enabled(x.device.type):
        return apply_linear(module, x, backend)
    rows, fn = state.bound_linears.get(name, (None, None))
    if rows != x.shape[0]:
        fn = _bind_linear(module, x, backend)
        state.bound_linears[name] = (x.shape[0], fn)
    return fn(x)
