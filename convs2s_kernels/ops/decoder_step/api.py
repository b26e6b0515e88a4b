"""``decoder_step``: the public function (checks its inputs, then calls the backend the dispatcher picks)."""

from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import torch

from ..._checks import check_index, check_shape, check_tensor
from ...dispatch import resolve
from .._packing import check_packed_matrix
from ..conv_step.packing import check_packed_weight
from ..linear_w8a8.api import check_packed, check_weight_range
from ..linear_w8a8.reference import check_activation_bits, check_weight_bits
from .layers import StepLayer

__all__ = ["decoder_step", "decoder_step_tensors"]


def decoder_step_tensors(x, states, layers, emb_scores, *args, **kwargs):
    """The floating tensors of a call, the activation first (for the backends' capabilities)."""
    weights = [t for layer in layers for t in (layer.conv_weight, layer.conv_bias, layer.proj_weight)]
    return (x, emb_scores, *states, *weights)


def _check_biases(i: int, layer: StepLayer, x: torch.Tensor) -> None:
    """Each bias one value per output of its weight, beside x (the kernels read it as such)."""
    conv_out = layer.conv_weight.shape[0] if layer.conv_scale is not None else layer.conv_weight.shape[-1]
    proj_out = None if layer.proj_weight is None else layer.proj_weight.shape[0]
    for name, bias, n in (("conv_bias", layer.conv_bias, conv_out), ("proj_bias", layer.proj_bias, proj_out)):
        if bias is None:
            continue
        if n is None:
            raise ValueError(f"layers[{i}].{name} is given but layers[{i}].proj_weight is None")
        if bias.dim() != 1 or bias.shape[0] != n:
            raise ValueError(f"layers[{i}].{name} must have shape ({n},), one per output, got {tuple(bias.shape)}")
        if bias.device != x.device:
            raise ValueError(f"layers[{i}].{name} is on {bias.device} but x is on {x.device}")


def _check_layers(states, layers, x: torch.Tensor) -> None:
    if len(states) != len(layers):
        raise ValueError(f"states has {len(states)} entries but there are {len(layers)} layers")
    for i, layer in enumerate(layers):
        if not isinstance(layer, StepLayer):
            raise TypeError(f"layers[{i}] must be a convs2s_kernels.StepLayer, got {type(layer).__name__}")
        try:
            check_weight_bits(layer.weight_bits)
            if layer.int8_activations:
                check_activation_bits(layer.activation_bits)
        except ValueError as exc:  # "activation_bits must be ...": name the layer
            raise ValueError(f"layers[{i}].{exc}") from None
        if not 0 <= layer.residual <= i + 1:
            raise ValueError(f"layers[{i}].residual = {layer.residual} reaches before the first layer's input")
        for part in ("conv", "proj"):
            if layer.int8_activations and getattr(layer, f"{part}_scale") is not None:
                check_weight_range(getattr(layer, f"{part}_weight"), layer.weight_bits)  # once per tensor, as linear_w8a8 does
            packed = getattr(layer, f"{part}_packed")
            if packed is None:
                continue
            if part == "conv" and layer.conv_scale is None:  # a float conv weight, packed for the conv step
                check_packed_weight(packed, layer.conv_weight)
                continue
            if part == "proj" and layer.proj_weight is None:
                raise ValueError(f"layers[{i}].proj_packed is given but layers[{i}].proj_weight is None")
            if part == "proj" and layer.proj_scale is None:  # a float projection, packed for linear
                check_packed_matrix(packed, layer.proj_weight, layer.proj_weight.t(), "pack_linear_weight")
                continue
            if getattr(layer, f"{part}_scale") is None or not layer.int8_activations:
                raise ValueError(f"layers[{i}].{part}_packed is for int8 weights with int8 activations "
                                 f"({part}_scale set, int8_activations=True)"
                                 + (" or pack_conv_step_weight of a float conv weight" if part == "conv" else
                                    " or pack_linear_weight of a float projection"))
            check_packed(getattr(layer, f"{part}_weight"), packed)
        _check_biases(i, layer, x)
        check_tensor(f"states[{i}]", states[i], 3)
        if states[i].shape[0] != states[0].shape[0]:
            raise ValueError(f"states[{i}] has {states[i].shape[0]} rows but states[0] has {states[0].shape[0]}")
        if states[i].device != x.device:
            raise ValueError(f"states[{i}] is on {states[i].device} but x is on {x.device}")


def decoder_step(x: torch.Tensor, states: Sequence[torch.Tensor], layers: Sequence[StepLayer],
                 emb_scores: torch.Tensor, pad_mask: torch.Tensor, src_lengths: torch.Tensor,
                 beam_index: Optional[torch.Tensor] = None, *, need_attn: bool = False,
                 backend: Optional[str] = None) -> Tuple[torch.Tensor, Optional[torch.Tensor], List[torch.Tensor]]:
    """Every layer of one decoding step in one call: residual (projected), conv step + GLU,
    folded attention and the residual sum, layer after layer.

    ``x (N, C_0)`` (``N = B * beam`` rows, a sentence's beams adjacent), ``states[i]
    (N_prev, k_i - 1, C_in_i)``, ``layers`` one :class:`convs2s_kernels.StepLayer` each,
    ``emb_scores (B, beam, S)`` the target embeddings' scores against the encoder outputs,
    ``pad_mask (B, S)`` bool (True at source padding), ``src_lengths (B,)`` true source lengths,
    ``beam_index (N,)`` parent rows -> ``(x (N, C_L), attention averaged over layers (N, S) or
    None, new states)``; ``states`` are not modified. See
    :func:`convs2s_kernels.decoder_step_ref`.
    """
    check_tensor("x", x, 2)
    check_tensor("emb_scores", emb_scores, 3)
    B, beam, S = emb_scores.shape
    if B * beam != x.shape[0]:
        raise ValueError(f"emb_scores is (B, beam, S) = {tuple(emb_scores.shape)} but x has {x.shape[0]} rows, "
                         f"not B * beam = {B * beam}")
    check_tensor("pad_mask", pad_mask, 2, floating=False)
    check_shape("pad_mask", pad_mask, (B, S), "(B, S)")
    for name, t in (("emb_scores", emb_scores), ("pad_mask", pad_mask)):
        if t.device != x.device:
            raise ValueError(f"{name} is on {t.device} but x is on {x.device}")
    check_tensor("src_lengths", src_lengths, 1, floating=False)
    check_shape("src_lengths", src_lengths, (B,), "(B,)")
    _check_layers(states, layers, x)
    if beam_index is not None:
        check_index("beam_index", beam_index, x.shape[0], x.device, low=0, high=states[0].shape[0] - 1)
    args = (x, states, layers, emb_scores, pad_mask, src_lengths, beam_index)
    fn = resolve("decoder_step", x.device, backend, *args, need_attn=need_attn)
    return fn(*args, need_attn=need_attn)
