"""The full ConvS2S model and its builder."""

from __future__ import annotations

from typing import Optional, Tuple

import torch
import torch.nn as nn

import convs2s_kernels as ck
from convs2s_kernels.ops.linear_w8a8.reference import check_weight_bits

from .architectures import ConfigError, ConvS2SConfig, get_config
from .decoder import Decoder, DecoderState
from .encoder import Encoder, EncoderOut
from .layers import WeightNormed
from .special_tokens import NUM_SPECIALS

# quantize_decoder_int8's and quantize_encoder_int8's activations: int8 or 7-bit rows (linear_w8a8),
# or float32 (linear_int8)
INT8_ACTIVATIONS = ("int8", "int7", "float")


class ConvS2SModel(nn.Module):
    """Encoder + decoder with fairseq's state-dict names and calling conventions.

    ``model(src_tokens, src_lengths, prev_output_tokens)`` returns ``(logits (B, T, V), attn)``
    where ``src_tokens`` are left-padded (pad = 1) ending in EOS = 2, ``prev_output_tokens``
    start with EOS and are right-padded, and ``attn`` is the attention averaged over decoder
    layers (B, T, S), computed in eval mode (None in training, as fairseq).

    ``backend`` is the fused-op backend request passed to every op of the model: None (the
    dispatcher's default, which honours ``CONVS2S_KERNELS_BACKEND``), one name (strict), or a
    preference list such as ``"cpp,reference"``; :meth:`use_backend` sets the latter.
    """

    def __init__(self, cfg: ConvS2SConfig, src_vocab_size: int, tgt_vocab_size: int, weight_norm: bool = True):
        super().__init__()
        if src_vocab_size <= NUM_SPECIALS or tgt_vocab_size <= NUM_SPECIALS:
            raise ConfigError(
                f"vocabularies need more than the {NUM_SPECIALS} special symbols, got {src_vocab_size} and {tgt_vocab_size}"
            )
        self.cfg = cfg
        self.encoder = Encoder(cfg, src_vocab_size, weight_norm)
        self.decoder = Decoder(cfg, tgt_vocab_size, weight_norm)
        self.backend: Optional[str] = None

    @property
    def src_vocab_size(self) -> int:
        return self.encoder.vocab_size

    @property
    def tgt_vocab_size(self) -> int:
        return self.decoder.vocab_size

    def max_positions(self) -> Tuple[int, int]:
        return self.encoder.max_positions, self.decoder.max_positions

    def forward(self, src_tokens: torch.Tensor, src_lengths: Optional[torch.Tensor],
                prev_output_tokens: torch.Tensor, need_attn: Optional[bool] = None):
        if src_lengths is not None:
            if not isinstance(src_lengths, torch.Tensor) or src_lengths.shape != src_tokens.shape[:1]:
                raise ValueError(f"src_lengths must be a ({src_tokens.shape[0]},) tensor of source lengths")
        encoder_out = self.encoder(src_tokens, backend=self.backend)
        if src_lengths is not None and not torch.equal(src_lengths.to(encoder_out.src_lengths), encoder_out.src_lengths):
            raise ValueError("src_lengths disagree with the number of non-pad tokens of src_tokens")
        if prev_output_tokens.shape[0] != src_tokens.shape[0]:
            raise ValueError(
                f"prev_output_tokens has {prev_output_tokens.shape[0]} rows but src_tokens has {src_tokens.shape[0]}"
            )
        if need_attn is None:
            need_attn = not self.training
        return self.decoder(prev_output_tokens, encoder_out, need_attn=need_attn, backend=self.backend)

    def use_backend(self, backend: Optional[str]) -> "ConvS2SModel":
        """Prefer ``backend`` for every op, falling back to the reference where it has no kernel."""
        if backend in (None, "auto"):
            self.backend = None
        else:
            ck.requested_backends(backend)  # validates the names
            self.backend = backend if backend == "reference" else f"{backend},reference"
        return self

    # --- incremental decoding -------------------------------------------------------------
    def encode(self, src_tokens: torch.Tensor) -> EncoderOut:
        return self.encoder(src_tokens, backend=self.backend)

    def init_decoder_state(self, encoder_out: EncoderOut, beam: int = 1, fold_attention: bool = False) -> DecoderState:
        return self.decoder.init_state(encoder_out, beam, fold_attention, backend=self.backend)

    def decode_step(self, tokens: torch.Tensor, state: DecoderState, need_attn: bool = False):
        """``(logits (N, V), attn (N, S) or None)`` for one step; see :meth:`Decoder.forward_step`."""
        return self.decoder.forward_step(tokens, state, need_attn=need_attn, backend=self.backend)

    # --- inference preparation -----------------------------------------------------------
    def fold_weight_norm(self) -> "ConvS2SModel":
        """Replace every ``weight_g``/``weight_v`` pair by its plain ``weight`` (inference speed)."""
        for m in self.modules():
            if isinstance(m, WeightNormed):
                m.fold_weight_norm()
        return self

    def quantize_decoder_int8(self, enabled: bool = True, *, activations: str = "int8",
                              weight_bits: int = 8) -> "ConvS2SModel":
        """int8 decoding steps (``decode_step``, ``generate``): every decoder linear layer and
        convolution multiplies by its weight quantised per output row (a quarter of float32's
        bytes to stream). ``activations="int8"`` quantises each row of its input too and runs
        integer dot products (:func:`convs2s_kernels.linear_w8a8`); ``"int7"`` quantises the rows
        to 7 bits ([-63, 63]), which AVX2 CPUs without VNNI multiply with fewer instructions;
        ``"float"`` keeps float32 activations and sums (weight-only,
        :func:`convs2s_kernels.linear_int8`). ``weight_bits=7`` quantises the weights to [-63, 63]
        instead of [-127, 127], twice as coarse: with ``"int7"`` activations the AVX2 kernel then adds
        two products' pairs before widening them (fewer instructions; no change with VNNI). With int8
        or int7 activations, folded attention (``fold_attention=True``) multiplies its per-sentence
        products in int8 as well (``Linear.fold_int8``). The parameters and the full forward
        (training, scoring) are untouched; ``enabled=False`` turns it off."""
        return self._quantize_int8(self.decoder, enabled, activations, weight_bits)

    def quantize_encoder_int8(self, enabled: bool = True, *, activations: str = "int8",
                              weight_bits: int = 8) -> "ConvS2SModel":
        """The same for the encoder whenever it runs without gradients (``encode`` and the full
        forward under ``torch.no_grad``: translating, scoring, validation): its linear layers and
        convolutions (each step's window of inputs one row of the int8 product,
        :meth:`ConvTBCWeight.int8_sequence`). Training and anything with gradients keep float32.
        ``activations="float"`` is allowed but slow: past the few-row kernels' 64 rows,
        ``linear_int8`` turns each weight back into float32 per call. ``weight_bits`` as for the
        decoder, but 7 bits cost more BLEU here than there (``bench/results/amd-zen5-2c/README.md``)."""
        return self._quantize_int8(self.encoder, enabled, activations, weight_bits)

    def _quantize_int8(self, part: nn.Module, enabled: bool, activations: str, weight_bits: int) -> "ConvS2SModel":
        if activations not in INT8_ACTIVATIONS:
            raise ValueError(f"activations must be one of {', '.join(map(repr, INT8_ACTIVATIONS))}, got {activations!r}")
        weight_bits = check_weight_bits(weight_bits)
        for m in part.modules():
            if isinstance(m, WeightNormed):
                m.use_int8 = enabled
                m.int8_activations = activations != "float"
                m.int8_activation_bits = 7 if activations == "int7" else 8
                m.int8_weight_bits = weight_bits
        return self

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())


def build_model(arch: str, src_vocab_size: int, tgt_vocab_size: int, *, weight_norm: bool = True,
                **overrides) -> ConvS2SModel:
    """Build a named architecture (``fconv_wmt_en_fr``, ``fconv_iwslt_de_en``, ...) or ``custom``.

    ``overrides`` are :class:`~convs2s.architectures.ConvS2SConfig` fields, e.g. ``dropout=0.2``
    or ``encoder_layers="[(256, 3)] * 2"``.
    """
    cfg = get_config(arch, **overrides)
    return ConvS2SModel(cfg, src_vocab_size, tgt_vocab_size, weight_norm=weight_norm)
