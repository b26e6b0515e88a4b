"""The full ConvS2S model and its builder."""

from __future__ import annotations

from typing import Optional, Tuple

import torch
import torch.nn as nn

import convs2s_kernels as ck

from .architectures import ConfigError, ConvS2SConfig, get_config
from .decoder import Decoder
from .encoder import Encoder, EncoderOut
from .layers import WeightNormed
from .special_tokens import NUM_SPECIALS


class ConvS2SModel(nn.Module):
    """Encoder + decoder with fairseq's state-dict names and calling conventions.

    ``model(src_tokens, src_lengths, prev_output_tokens)`` returns ``(logits (B, T, V), attn)``
    where ``src_tokens`` are left-padded (pad = 1) ending in EOS = 2, ``prev_output_tokens``
    start with EOS and are right-padded, and ``attn`` is the attention averaged over decoder
    layers (B, T, S), computed in eval mode (None in training, as fairseq).

    ``backend`` is the fused-op backend request passed to every op of the model: None (the
    dispatcher's default, which honours ``CONVS2S_KERNELS_BACKEND``), one name (strict), or a
    preference list such as ``"cpp,reference"``; :meth:`use_backend` sets the latter.

    Decoding (incremental steps, beam search, int8) runs on the model's preparation,
    :func:`convs2s.engine.prepare`.
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
                prev_output_tokens: torch.Tensor, need_attn: Optional[bool] = None, features_only: bool = False):
        if src_lengths is not None:
            if not isinstance(src_lengths, torch.Tensor) or src_lengths.shape != src_tokens.shape[:1]:
                raise ValueError(f"src_lengths must be a ({src_tokens.shape[0]},) tensor of source lengths")
        encoder_out = self.encoder(src_tokens, backend=self.backend)
        if src_lengths is not None and not torch.compiler.is_compiling() \
                and not torch.equal(src_lengths.to(encoder_out.src_lengths), encoder_out.src_lengths):
            raise ValueError("src_lengths disagree with the number of non-pad tokens of src_tokens")
        if prev_output_tokens.shape[0] != src_tokens.shape[0]:
            raise ValueError(
                f"prev_output_tokens has {prev_output_tokens.shape[0]} rows but src_tokens has {src_tokens.shape[0]}"
            )
        if need_attn is None:
            need_attn = not self.training
        return self.decoder(prev_output_tokens, encoder_out, need_attn=need_attn, backend=self.backend,
                            features_only=features_only)

    def use_backend(self, backend: Optional[str]) -> "ConvS2SModel":
        """Prefer ``backend`` for every op, falling back to the reference where it has no kernel."""
        if backend in (None, "auto"):
            self.backend = None
        else:
            ck.requested_backends(backend)  # validates the names
            self.backend = backend if backend == "reference" else f"{backend},reference"
        return self

    def encode(self, src_tokens: torch.Tensor) -> EncoderOut:
        return self.encoder(src_tokens, backend=self.backend)

    def fold_weight_norm(self) -> "ConvS2SModel":
        """Replace every ``weight_g``/``weight_v`` pair by its plain ``weight`` (inference speed)."""
        for m in self.modules():
            if isinstance(m, WeightNormed):
                m.fold_weight_norm()
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
