"""The weights of one decoder layer as ``decoder_step`` takes them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

__all__ = ["StepAttention", "StepLayer"]


@dataclass(frozen=True)
class StepAttention:
    """An attention layer folded into the encoder outputs of the batch's sentences (computed once
    per batch): ``z_in = z W_in (B, S, C)``, ``z_bias = z . b_in (B, S)``, ``y_out = y W_out^T
    (B, S, C)`` and the output bias ``b_out (C,)``."""

    z_in: torch.Tensor
    z_bias: torch.Tensor
    y_out: torch.Tensor
    b_out: torch.Tensor


@dataclass(frozen=True)
class StepLayer:
    """One decoder layer: its convolution, residual connection and attention.

    ``conv_weight`` is the ConvTBC weight ``(k, C_in, 2C)``, or with ``conv_scale`` its int8 rows
    ``(2C, k*C_in)`` from :func:`convs2s_kernels.quantize_int8`. ``residual`` is how many layers
    back the residual comes from (0: none), projected by ``proj_weight (C, C_res)`` (int8 with
    ``proj_scale``) when the widths differ. ``attention`` is None for a layer without one.
    ``int8_activations``: the int8 products quantise their inputs per row too (``linear_w8a8``)
    instead of keeping them float32 (``linear_int8``); ``conv_packed`` / ``proj_packed`` are then
    :func:`convs2s_kernels.pack_w8a8_weight` of the int8 weights, for the cpp kernels (optional),
    and ``activation_bits`` (8 or 7) what those inputs are quantised to (``linear_w8a8``'s);
    ``weight_bits`` (8 or 7) the range the int8 weights hold (``linear_w8a8``'s: 7 for those of
    ``quantize_int8(w, bits=7)``).
    With float weights, ``conv_packed`` may be :func:`convs2s_kernels.pack_conv_step_weight` of the
    conv weight and ``proj_packed`` :func:`convs2s_kernels.pack_linear_weight` of the projection,
    which the cpp kernels read instead (optional; the reference ignores them).
    """

    conv_weight: torch.Tensor
    conv_bias: Optional[torch.Tensor] = None
    conv_scale: Optional[torch.Tensor] = None
    residual: int = 0
    proj_weight: Optional[torch.Tensor] = None
    proj_bias: Optional[torch.Tensor] = None
    proj_scale: Optional[torch.Tensor] = None
    attention: Optional[StepAttention] = None
    int8_activations: bool = False
    conv_packed: Optional[torch.Tensor] = None
    proj_packed: Optional[torch.Tensor] = None
    activation_bits: int = 8
    weight_bits: int = 8
