"""A model prepared for decoding (in the spirit of CTranslate2's ``Translator(model, device,
compute_type)``): one object per model that owns what decoding derives from its weights (int8,
packed copies, huge pages), asks for the kernel choice of its shapes, and runs the encoder and
the step programs on them."""

from __future__ import annotations

from typing import Dict, Optional, Tuple

import torch
import torch.nn.functional as F

import convs2s_kernels as ck
from convs2s_kernels.ops.linear_w8a8.reference import check_weight_bits
from convs2s_kernels.tune import ensure as ensure_kernel_choice

from ..encoder import EncoderOut
from ..layers import SQRT_HALF, make_positions, residual_input
from ..special_tokens import PAD
from . import step as _step
from .shapes import encoder_weight_shapes
from .state import DecoderState
from .variants import VARIANTS
from .weights import DerivedWeights, conv_int8_sequence, cpp_may_run, is_weight_layer, linear

# the int8 products' activations: int8 or 7-bit rows (linear_w8a8), or float32 (linear_int8)
INT8_ACTIVATIONS = ("int8", "int7", "float")

_ATTRIBUTE = "_convs2s_prepared"  # where a model keeps its preparation (engine state, never read by the model)


class PreparedModel:
    """A :class:`convs2s.model.ConvS2SModel` prepared for decoding; get one with :func:`prepare`.

    ``encode(src_tokens)``, ``init_decoder_state(encoder_out, beam, fold_attention)`` and
    ``decode_step(tokens, state)`` are the incremental decoder :func:`convs2s.generate` runs; the
    model's parameters stay the model's, and every derived copy follows them when they change.
    """

    # Run a step's layers in one C++ call (convs2s.engine.fused) where the cpp backend may run it;
    # False keeps the op-by-op loop (same outputs, for comparisons).
    fused_step = True

    def __init__(self, model):
        self.model = model
        self._derived: Dict[int, DerivedWeights] = {}

    def __deepcopy__(self, memo):
        return None  # a copied model prepares itself anew: derived copies are not the model's

    def __repr__(self) -> str:
        return f"PreparedModel({type(self.model).__name__}, backend={self.backend!r})"

    @property
    def backend(self) -> Optional[str]:
        return self.model.backend

    def derived(self, module) -> Optional[DerivedWeights]:
        """``module``'s derived record (None for a layer without one: a plain ``nn.Linear``, None)."""
        if module is None or not is_weight_layer(module):
            return None
        d = self._derived.get(id(module))
        if d is None or d.module is not module:  # a new module may take a dropped one's id
            d = self._derived[id(module)] = DerivedWeights(module)
        return d

    def linear(self, module, x: torch.Tensor) -> torch.Tensor:
        """``module``'s product for inference (:func:`convs2s.engine.weights.linear`)."""
        return linear(self.derived(module), module, x, self.backend)

    # --- int8 ---------------------------------------------------------------------------------
    def quantize_decoder_int8(self, enabled: bool = True, *, activations: str = "int8",
                              weight_bits: int = 8) -> "PreparedModel":
        """int8 decoding steps: every decoder linear layer and convolution multiplies by its weight
        quantised per output row (a quarter of float32's bytes to stream). ``activations="int8"``
        quantises each row of its input too (:func:`convs2s_kernels.linear_w8a8`); ``"int7"`` to 7
        bits ([-63, 63], fewer instructions on AVX2 without VNNI); ``"float"`` keeps float32
        activations (:func:`convs2s_kernels.linear_int8`). ``weight_bits=7`` quantises the weights
        to [-63, 63]. With int8 or int7 activations the folded attention's products are int8 too.
        The parameters and the model's own forward are untouched; ``enabled=False`` turns it off."""
        return self._quantize_int8(self.model.decoder, enabled, activations, weight_bits)

    def quantize_encoder_int8(self, enabled: bool = True, *, activations: str = "int8",
                              weight_bits: int = 8) -> "PreparedModel":
        """The same for :meth:`encode` without gradients: its linear layers and convolutions (each
        step's window of inputs one row of the int8 product). ``weight_bits=7`` costs more BLEU
        here than in the decoder (``bench/results/amd-zen5-2c/README.md``)."""
        return self._quantize_int8(self.model.encoder, enabled, activations, weight_bits)

    def _quantize_int8(self, part, enabled: bool, activations: str, weight_bits: int) -> "PreparedModel":
        if activations not in INT8_ACTIVATIONS:
            raise ValueError(f"activations must be one of {', '.join(map(repr, INT8_ACTIVATIONS))}, got {activations!r}")
        weight_bits = check_weight_bits(weight_bits)
        for m in part.modules():
            d = self.derived(m)
            if d is not None:
                d.use_int8 = enabled
                d.int8_activations = activations != "float"
                d.int8_activation_bits = 7 if activations == "int7" else 8
                d.int8_weight_bits = weight_bits
        return self

    # --- decoding -----------------------------------------------------------------------------
    def encode(self, src_tokens: torch.Tensor) -> EncoderOut:
        """The encoder; without gradients its products run the dispatched ops on the derived
        weights (a short batch is a few-row product against a large weight), with gradients the
        model's own forward."""
        encoder, backend = self.model.encoder, self.backend
        if torch.is_grad_enabled():
            return encoder(src_tokens, backend=backend)
        src_tokens, pad_mask = encoder.check_sources(src_tokens)
        if src_tokens.device.type == "cpu":
            ensure_kernel_choice(encoder_weight_shapes(self))  # which row counts run the few-row kernels
        x = encoder.embed_tokens(src_tokens) + encoder.embed_positions(make_positions(src_tokens, PAD))
        x = F.dropout(x, encoder.dropout, encoder.training)
        input_embedding = x
        x = self.linear(encoder.fc1, x)
        mask = pad_mask if bool(pad_mask.any()) else None
        residuals = [x]
        for proj, conv, r in zip(encoder.projections, encoder.convolutions, encoder.residuals):
            residual = residual_input(residuals, proj, r, self.linear)
            x = F.dropout(x, encoder.dropout, encoder.training)
            d = self.derived(conv)
            if d.use_int8:
                x = conv_int8_sequence(d, x, causal=False, pad_mask=mask, backend=backend)
                x = x if residual is None else (x + residual) * SQRT_HALF
            else:
                # the weight packed as the decoding step reads it (a sentence or two is a few dozen
                # rows, where the few-row kernel's register tiles beat the GEMM)
                x = ck.conv_glu(x, d.weight(), conv.bias, causal=False, residual=residual,
                                scale=SQRT_HALF if residual is not None else None, pad_mask=mask,
                                packed=d.step_packed() if cpp_may_run(x, backend) else None, backend=backend)
            residuals.append(x)
        return encoder.output(self.linear(encoder.fc2, x), input_embedding, pad_mask, mask)

    def init_decoder_state(self, encoder_out: EncoderOut, beam: int = 1, fold_attention: bool = False) -> DecoderState:
        """A fresh state for ``B * beam`` rows (beams of a sentence adjacent): :func:`convs2s.engine.step.init_state`."""
        return _step.init_state(self, encoder_out, beam, fold_attention)

    def decode_step(self, tokens: torch.Tensor, state: DecoderState,
                    need_attn: bool = False) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
        """``(logits (N, V), attn (N, S) or None)`` for one step: :func:`convs2s.engine.step.decode_step`."""
        return _step.decode_step(self, tokens, state, need_attn)


def prepare(model, compute_type: Optional[str] = None) -> PreparedModel:
    """``model``'s preparation for decoding (made once per model object, then the same one), with
    ``compute_type`` applied to it when given: ``fp32``, ``bf16`` or an int8 variant name
    (:data:`convs2s.engine.variants.VARIANTS`; ``bf16`` casts the model's parameters; ``int8`` is
    that one variant, where :class:`convs2s.Translator` measures the fastest of them). A
    :class:`PreparedModel` is returned as it is."""
    if isinstance(model, PreparedModel):
        prepared = model
    else:
        prepared = model.__dict__.get(_ATTRIBUTE)
        if prepared is None or prepared.model is not model:  # (a deep copy holds its original's)
            prepared = PreparedModel(model)
            model.__dict__[_ATTRIBUTE] = prepared
    if compute_type is not None:
        if isinstance(compute_type, str) and compute_type not in VARIANTS:
            measured = " ('auto' is a choice measured per model and machine: convs2s.Translator makes it)" \
                if compute_type == "auto" else ""
            raise ValueError(f"unknown compute type {compute_type!r}; choose from {', '.join(VARIANTS)}{measured}")
        v = VARIANTS[compute_type] if isinstance(compute_type, str) else compute_type
        prepared.model.to(dtype=v.dtype)
        prepared.quantize_decoder_int8(v.int8, activations=v.activations or "int8", weight_bits=v.weight_bits)
        prepared.quantize_encoder_int8(v.encoder, activations=v.activations or "int8")
    return prepared


def quantize_decoder_int8(model, enabled: bool = True, *, activations: str = "int8", weight_bits: int = 8):
    """:meth:`PreparedModel.quantize_decoder_int8` on ``model``'s preparation; returns ``model``."""
    prepare(model).quantize_decoder_int8(enabled, activations=activations, weight_bits=weight_bits)
    return model


def quantize_encoder_int8(model, enabled: bool = True, *, activations: str = "int8", weight_bits: int = 8):
    """:meth:`PreparedModel.quantize_encoder_int8` on ``model``'s preparation; returns ``model``."""
    prepare(model).quantize_encoder_int8(enabled, activations=activations, weight_bits=weight_bits)
    return model
