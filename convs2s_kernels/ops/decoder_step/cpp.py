"""``decoder_step`` on the cpp backend (``csrc/decoder_step_cpu.cpp``): every layer of a step in
one C++ call through the same kernels as the Python loop (few-row products, the conv step, ATen's
batched products and softmax; for float32 the folded attention through the few-row kernels and a
softmax loop of its own, equal up to rounding), removing about a hundred Python-level calls per
step. fp32/bf16 CPU activations, inference only."""

from __future__ import annotations

import torch

from ...dispatch import Capability, register
from ...extension import native
from .api import decoder_step_tensors

CAPABILITY = Capability(dtypes={"cpu": (torch.float32, torch.bfloat16)}, backward=False)


def _field(layers, name):
    return [getattr(layer, name) for layer in layers]


def _attention_field(layers, name):
    return [None if layer.attention is None else getattr(layer.attention, name) for layer in layers]


def decoder_step_cpp(x, states, layers, emb_scores, pad_mask, src_lengths, beam_index=None, *, need_attn=False):
    out = native().decoder_layers_step(
        x, emb_scores, list(states), beam_index, [layer.conv_weight.contiguous() for layer in layers], _field(layers, "conv_scale"),
        _field(layers, "conv_bias"), _field(layers, "residual"), _field(layers, "proj_weight"),
        _field(layers, "proj_scale"), _field(layers, "proj_bias"), _attention_field(layers, "z_in"),
        _attention_field(layers, "z_bias"), _attention_field(layers, "y_out"), _attention_field(layers, "b_out"),
        pad_mask, src_lengths.to(x.dtype).sqrt(), need_attn,
        [int(layer.activation_bits) if layer.int8_activations else 0 for layer in layers],
        _field(layers, "conv_packed"), _field(layers, "proj_packed"), [int(layer.weight_bits) for layer in layers])
    return out[0], out[1], list(out[2:])


register("cpp", "decoder_step", decoder_step_cpp, CAPABILITY, decoder_step_tensors)
