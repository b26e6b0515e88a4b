"""The ConvS2S encoder (paper section 3; fairseq ``FConvEncoder``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

import convs2s_kernels as ck
from convs2s_kernels.internal import indices_trusted

from .architectures import ConvS2SConfig
from .layers import SQRT_HALF, GradMultiply, Linear, conv_stack, embedding, make_positions, residual_input
from .special_tokens import EOS, PAD  # noqa: F401  (EOS: convs2s.encoder.EOS stays importable)


@dataclass
class EncoderOut:
    """Encoder outputs, one row per sentence.

    ``z (B, S, E)`` attention keys (pad steps zero), ``y (B, S, E)`` values ``(z + e) * sqrt(1/2)``,
    ``src_lengths (B,)`` true lengths (EOS included), ``pad_mask (B, S)`` True at (left) padding.
    """

    z: torch.Tensor
    y: torch.Tensor
    src_lengths: torch.Tensor
    pad_mask: torch.Tensor

    def index_select(self, index: torch.Tensor) -> "EncoderOut":
        return EncoderOut(*(t.index_select(0, index) for t in (self.z, self.y, self.src_lengths, self.pad_mask)))


def check_tokens(name: str, tokens, vocab_size: int, max_len: int) -> None:
    """Clear errors for the token tensors the model accepts."""
    if not isinstance(tokens, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor of token ids, got {type(tokens).__name__}")
    if tokens.dtype not in (torch.int64, torch.int32):
        raise TypeError(f"{name} must hold integer token ids (int64), got {tokens.dtype}")
    if tokens.dim() != 2:
        raise ValueError(f"{name} must have shape (B, T), got {tuple(tokens.shape)}")
    if tokens.shape[1] == 0 or tokens.shape[0] == 0:
        raise ValueError(f"{name} is empty: shape {tuple(tokens.shape)}")
    if tokens.shape[1] > max_len:
        raise ValueError(
            f"{name} has {tokens.shape[1]} steps but the position table allows at most {max_len} "
            "(EOS included); shorten or split the sentence"
        )
    if torch.compiler.is_compiling() or indices_trusted():  # traced (no host reads), or a search's own topk ids
        return
    lo, hi = int(tokens.min()), int(tokens.max())
    if lo < 0 or hi >= vocab_size:
        raise ValueError(f"{name} ids must lie in [0, {vocab_size - 1}] (the vocabulary), got min {lo}, max {hi}")


class Encoder(nn.Module):
    def __init__(self, cfg: ConvS2SConfig, vocab_size: int, weight_norm: bool = True):
        super().__init__()
        p = cfg.dropout
        self.dropout = p
        self.vocab_size = vocab_size
        spec = cfg.encoder_layers
        embed_dim = cfg.encoder_embed_dim
        self.embed_tokens = embedding(vocab_size, embed_dim, PAD)
        self.embed_positions = embedding(cfg.max_source_positions, embed_dim, PAD)
        self.fc1 = Linear(embed_dim, spec[0][0], dropout=p, weight_norm=weight_norm)
        self.projections, self.convolutions = conv_stack(spec, p, weight_norm)
        self.residuals = [r for _, _, r in spec]
        self.fc2 = Linear(spec[-1][0], embed_dim, weight_norm=weight_norm)
        # Set by the model: the encoder's gradient is scaled by 1 / (2 * number of attention layers).
        self.num_attention_layers = cfg.num_attention_layers

    @property
    def max_positions(self) -> int:
        return self.embed_positions.num_embeddings - PAD - 1

    def check_sources(self, src_tokens: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """``src_tokens`` as int64 after the checks, and its pad mask (left padding only)."""
        check_tokens("src_tokens", src_tokens, self.vocab_size, self.max_positions)
        src_tokens = src_tokens.long()
        pad_mask = src_tokens.eq(PAD)
        if not torch.compiler.is_compiling() and bool((pad_mask[:, 1:] & ~pad_mask[:, :-1]).any()):  # eager only
            raise ValueError("src_tokens must be left-padded (pad = 1 only before the first real token of a row)")
        if not torch.compiler.is_compiling() and bool(pad_mask.all(dim=1).any()):
            raise ValueError("src_tokens has a row made only of padding; every source needs at least EOS")
        return src_tokens, pad_mask

    def forward(self, src_tokens: torch.Tensor, backend: Optional[str] = None) -> EncoderOut:
        """``src_tokens (B, S)`` (left-padded, EOS last) -> :class:`EncoderOut`."""
        src_tokens, pad_mask = self.check_sources(src_tokens)
        x = self.embed_tokens(src_tokens) + self.embed_positions(make_positions(src_tokens, PAD))
        x = ck.dropout(x, self.dropout, self.training, backend=backend)
        input_embedding = x
        x = self.fc1(x)
        mask = pad_mask if torch.compiler.is_compiling() or bool(pad_mask.any()) else None  # traced: an all-False mask is the identity
        residuals = [x]
        for proj, conv, r in zip(self.projections, self.convolutions, self.residuals):
            residual = residual_input(residuals, proj, r)
            # Dropout before masking equals fairseq's mask-then-dropout: dropped zeros stay zero.
            x = ck.dropout(x, self.dropout, self.training, backend=backend)
            x = ck.conv_glu(x, conv.effective_weight(), conv.bias, causal=False, residual=residual,
                            scale=SQRT_HALF if residual is not None else None, pad_mask=mask, backend=backend)
            residuals.append(x)
        return self.output(self.fc2(x), input_embedding, pad_mask, mask)

    def output(self, x: torch.Tensor, input_embedding: torch.Tensor, pad_mask: torch.Tensor,
               mask: Optional[torch.Tensor]) -> EncoderOut:
        """Keys ``z`` (pad steps zero, gradient scaled by 1 / (2 * #attention)) and values
        ``y = (z + e) sqrt(1/2)`` from fc2's output ``x``."""
        if mask is not None:
            x = x.masked_fill(mask.unsqueeze(-1), 0.0)
        if torch.is_grad_enabled():  # identity forward: skip its copy at inference
            x = GradMultiply.apply(x, 1.0 / (2.0 * self.num_attention_layers))
        y = (x + input_embedding) * SQRT_HALF
        src_lengths = (~pad_mask).sum(dim=1)
        return EncoderOut(z=x, y=y, src_lengths=src_lengths, pad_mask=pad_mask)
