"""The ConvS2S decoder with multi-step attention (paper section 3; fairseq ``FConvDecoder``).

Two paths compute the same function:

* :meth:`Decoder.forward` — the whole target prefix at once (training, scoring);
* :meth:`Decoder.forward_step` — one token per row, carrying an :class:`IncrementalState` that
  holds the last ``k-1`` inputs of every convolution (fairseq's ``LinearizedConvolution``).

Fast decoding (beam search, folded attention, int8, the one-call and recorded steps) is the
engine's: :mod:`convs2s.engine`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

import convs2s_kernels as ck

from .architectures import ConvS2SConfig
from .encoder import EncoderOut, check_tokens
from .layers import SQRT_HALF, Linear, WeightNormed, conv_stack, embedding, make_positions, residual_input
from .special_tokens import PAD


class AttentionLayer(nn.Module):
    """``d = (W_in h + b + g) sqrt(1/2)``, ``c = attention_embsum(d, z, y)``, ``(W_out c + b + h) sqrt(1/2)``."""

    def __init__(self, conv_channels: int, embed_dim: int, weight_norm: bool = True):
        super().__init__()
        self.in_projection = Linear(conv_channels, embed_dim, weight_norm=weight_norm)
        self.out_projection = Linear(embed_dim, conv_channels, weight_norm=weight_norm)

    def forward(self, h, target_embedding, enc: EncoderOut, need_attn: bool, backend=None):
        """``h (B, T, C)``, ``target_embedding (B, T, E)`` -> ``(out (B, T, C), attn (B, T, S) or None)``."""
        d = (self.in_projection(h) + target_embedding) * SQRT_HALF
        result = ck.attention_embsum(d, enc.z, enc.y, enc.src_lengths, return_attn=need_attn, backend=backend)
        context, attn = result if need_attn else (result, None)
        return (self.out_projection(context) + h) * SQRT_HALF, attn


class Decoder(nn.Module):
    def __init__(self, cfg: ConvS2SConfig, vocab_size: int, weight_norm: bool = True):
        super().__init__()
        p = cfg.dropout
        self.dropout = p
        self.vocab_size = vocab_size
        self.register_buffer("version", torch.tensor([2.0]))
        spec = cfg.decoder_layers
        embed_dim = cfg.decoder_embed_dim
        self.embed_tokens = embedding(vocab_size, embed_dim, PAD)
        self.embed_positions = embedding(cfg.max_target_positions, embed_dim, PAD)
        self.fc1 = Linear(embed_dim, spec[0][0], dropout=p, weight_norm=weight_norm)
        self.projections, self.convolutions = conv_stack(spec, p, weight_norm)
        self.attention = nn.ModuleList(
            AttentionLayer(c, embed_dim, weight_norm) if att else None
            for (c, _, _), att in zip(spec, cfg.decoder_attention)
        )
        self.residuals = [r for _, _, r in spec]
        self.share_input_output_embed = cfg.share_input_output_embed
        self.fc2 = Linear(spec[-1][0], cfg.decoder_out_embed_dim, weight_norm=weight_norm)
        if cfg.share_input_output_embed:
            # fairseq: a plain nn.Linear tied to the target embedding, bias with PyTorch's default init.
            self.fc3 = nn.Linear(cfg.decoder_out_embed_dim, vocab_size)
            self.fc3.weight = self.embed_tokens.weight
        else:
            self.fc3 = Linear(cfg.decoder_out_embed_dim, vocab_size, dropout=p, weight_norm=weight_norm)

    @property
    def max_positions(self) -> int:
        return self.embed_positions.num_embeddings - PAD - 1

    def output(self, x: torch.Tensor) -> torch.Tensor:
        """fc2, dropout, fc3: the last layer's output ``(..., C)`` -> logits ``(..., V)``."""
        return self.fc3(self.features(x))

    def features(self, x: torch.Tensor, backend: Optional[str] = None) -> torch.Tensor:
        """fc2 and dropout: what fc3 projects to the vocabulary."""
        return ck.dropout(self.fc2(x), self.dropout, self.training, backend=backend)

    def loss(self, features: torch.Tensor, target: torch.Tensor, label_smoothing: float,
             backend: Optional[str] = None) -> Tuple[torch.Tensor, torch.Tensor]:
        """fc3 and the label-smoothed cross-entropy in one op (``convs2s_kernels.output_loss``: the
        cpp backend never makes the whole logits): ``features (B, T, C)`` from ``forward(...,
        features_only=True)``, ``target (B, T)`` -> ``(loss, nll)`` summed over non-pad targets."""
        fc3 = self.fc3
        weight = fc3.effective_weight() if isinstance(fc3, WeightNormed) else fc3.weight
        x, target = features.reshape(-1, features.shape[-1]), target.reshape(-1)
        keep = target != PAD
        # pads add nothing: no products for them (traced, they stay and ignore_index drops them)
        if features.device.type == "cpu" and not torch.compiler.is_compiling() and not bool(keep.all()):
            x, target = x[keep], target[keep]
        return ck.output_loss(x, weight, fc3.bias, target, label_smoothing=label_smoothing, ignore_index=PAD,
                              backend=backend)

    def forward(self, prev_output_tokens: torch.Tensor, encoder_out: EncoderOut, need_attn: bool = True,
                backend: Optional[str] = None,
                features_only: bool = False) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
        """Full-sequence forward: ``prev_output_tokens (B, T)`` (EOS first, right-padded) ->
        ``(logits (B, T, V), attention averaged over layers (B, T, S) or None)``; with
        ``features_only``, what fc3 would project instead of the logits (for :meth:`loss`)."""
        check_tokens("prev_output_tokens", prev_output_tokens, self.vocab_size, self.max_positions)
        tokens = prev_output_tokens.long()
        x = self.embed_tokens(tokens) + self.embed_positions(make_positions(tokens, PAD))
        x = ck.dropout(x, self.dropout, self.training, backend=backend)
        target_embedding = x
        x = self.fc1(x)
        residuals = [x]
        avg_attn = None
        num_layers = len(self.convolutions)
        for proj, conv, attention, r in zip(self.projections, self.convolutions, self.attention, self.residuals):
            residual = residual_input(residuals, proj, r)
            x = ck.dropout(x, self.dropout, self.training, backend=backend)
            w, b = conv.effective_weight(), conv.bias
            if attention is None:
                x = ck.conv_glu(x, w, b, causal=True, residual=residual,
                                scale=SQRT_HALF if residual is not None else None, backend=backend)
            else:
                x = ck.conv_glu(x, w, b, causal=True, backend=backend)
                x, attn = attention(x, target_embedding, encoder_out, need_attn, backend)
                if attn is not None:
                    # fairseq divides by the number of layers, counting those without attention.
                    avg_attn = attn / num_layers if avg_attn is None else avg_attn + attn / num_layers
                if residual is not None:
                    x = (x + residual) * SQRT_HALF
            residuals.append(x)
        features = self.features(x, backend)
        return (features if features_only else self.fc3(features)), avg_attn

    # --- the incremental step (fairseq's incremental_state) ------------------------------------
    def init_incremental_state(self, encoder_out: EncoderOut) -> "IncrementalState":
        """Empty convolution windows for ``encoder_out``'s rows (zeros: the causal padding)."""
        rows = encoder_out.z.shape[0]
        windows = [encoder_out.z.new_zeros(rows, c.kernel_width - 1, c.in_channels) for c in self.convolutions]
        return IncrementalState(encoder_out, windows)

    def step_position(self, tokens: torch.Tensor, rows: int, step: int) -> int:
        """The position-table row of decoding step ``step``, after checking its ``tokens (rows,)``."""
        if tokens.dim() != 1 or tokens.shape[0] != rows:
            raise ValueError(f"tokens must have shape ({rows},) for {rows} rows, got {tuple(tokens.shape)}")
        position = PAD + step + 1
        if position >= self.embed_positions.num_embeddings:
            raise ValueError(f"step {step} is past the position table ({self.max_positions} positions)")
        check_tokens("tokens", tokens.view(-1, 1), self.vocab_size, 1)
        return position

    def forward_step(self, tokens: torch.Tensor, state: "IncrementalState", need_attn: bool = True,
                     backend: Optional[str] = None) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
        """The next position of every row: ``tokens (N,)`` (EOS at step 0) -> ``(logits (N, V),
        averaged attention (N, S) or None)``; equals :meth:`forward`'s last position. Advances ``state``."""
        position = self.step_position(tokens, state.encoder_out.z.shape[0], state.step)
        x = self.embed_tokens(tokens.long()) + self.embed_positions.weight[position]
        x = F.dropout(x, self.dropout, self.training)
        target_embedding = x.unsqueeze(1)
        x = self.fc1(x)
        residuals, avg_attn, num_layers = [x], None, len(self.convolutions)
        for i, (proj, conv, attention, r) in enumerate(
            zip(self.projections, self.convolutions, self.attention, self.residuals)
        ):
            residual = residual_input(residuals, proj, r)
            x = F.dropout(x, self.dropout, self.training)
            x, state.windows[i] = ck.conv_step(x, state.windows[i], conv.effective_weight(), conv.bias,
                                               backend=backend)
            if attention is not None:
                out, attn = attention(x.unsqueeze(1), target_embedding, state.encoder_out, need_attn, backend)
                x = out.squeeze(1)
                if attn is not None:
                    avg_attn = attn.squeeze(1) / num_layers if avg_attn is None else avg_attn + attn.squeeze(1) / num_layers
            if residual is not None:
                x = (x + residual) * SQRT_HALF
            residuals.append(x)
        state.step += 1
        return self.output(x), avg_attn


@dataclass
class IncrementalState:
    """A plain incremental step's state: ``windows[i] (N, k_i - 1, C_in_i)``, each convolution's
    last inputs, oldest first; the encoder outputs, one row per decoded row."""

    encoder_out: EncoderOut
    windows: List[torch.Tensor]
    step: int = 0

    def reorder(self, index: torch.Tensor) -> None:
        """Row ``n`` continues old row ``index[n]`` (a beam search's parents)."""
        self.windows = [w.index_select(0, index) for w in self.windows]
        self.encoder_out = self.encoder_out.index_select(index)
