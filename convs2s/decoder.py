"""The ConvS2S decoder with multi-step attention (paper section 3; fairseq ``FConvDecoder``).

Two paths compute the same function:

* :meth:`Decoder.forward` — the whole target prefix at once (training, scoring);
* :meth:`Decoder.forward_step` — one token per row, carrying a :class:`DecoderState` that holds
  the last ``k-1`` inputs of every convolution and the encoder outputs. Rows are grouped per
  sentence (``N = B * beam``, beams of a sentence adjacent), so the encoder outputs are kept once
  per sentence and attention treats a sentence's beams as its queries (fairseq's BeamableMM).
"""

from __future__ import annotations

from typing import List, Optional, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

import convs2s_kernels as ck
from convs2s_kernels.dispatch import BoundCalls
from convs2s_kernels.huge_pages import move_to_huge_pages
from convs2s_kernels.tune import ensure as ensure_kernel_choice

from .architectures import ConvS2SConfig
from .encoder import EncoderOut, check_tokens
from .fused_step import fused_layers_step, fused_step_reason, step_linear
from .layers import (NO_DISPATCH, SQRT_HALF, Linear, apply_linear, conv_stack, cpp_may_run, embedding, make_positions,
                     residual_input)
from .special_tokens import PAD
from .step_shapes import fold_weight_shapes, step_weight_modules, step_weight_shapes


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


class FoldedAttention:
    """An attention layer's step-independent products, computed once per sentence (exact algebra):

    ``scores = sqrt(1/2) (h . (W_in^T z_s) + b_in . z_s + g . z_s)`` and
    ``W_out (sqrt(s) sum_s a_s y_s) + b_out = sqrt(s) sum_s a_s (W_out y_s) + b_out``,
    so a step costs ``S x C`` per row instead of the two ``E x C`` projections.
    """

    def __init__(self, layer: "AttentionLayer", enc: EncoderOut, backend: Optional[str] = None):
        inp, out = layer.in_projection, layer.out_projection  # W_in (E, C), W_out (C, E)
        self.z_bias = torch.matmul(enc.z, inp.bias)  # (B, S)
        self.b_out = out.bias
        keys, values = inp.fold_int8(transposed=True), out.fold_int8()
        if keys is not None and values is not None:
            # an int8 x int8 step folds in int8 too, quantised as its own projections are (faster
            # whole decodes: bench/results/amd-zen5-2c/README.md, "the attention fold in int8")
            self.z_in = ck.linear_w8a8(enc.z, keys[0], keys[1], packed=keys[2], backend=backend,
                                       **inp.int8_activation_options())
            self.y_out = ck.linear_w8a8(enc.y, values[0], values[1], packed=values[2], backend=backend,
                                        **out.int8_activation_options())
            return
        # B * S rows each through the dispatched linear, on the cpp backend with both weights packed
        # as (E, C) matrices: the few-row kernel where measured faster than the GEMM for these
        # shapes (convs2s_kernels.tune; step_shapes.fold_weight_shapes), in pieces past its row cap.
        packs = cpp_may_run(enc.z, backend)  # only cpp reads them
        self.z_in = ck.linear(enc.z, inp.effective_weight().t(), backend=backend,
                              packed=inp.fold_packed(transposed=True) if packs else None)  # (B, S, C)
        self.y_out = ck.linear(enc.y, out.effective_weight(), backend=backend,
                               packed=out.fold_packed() if packs else None)  # (B, S, C)

    def index_select(self, index: torch.Tensor) -> None:
        self.z_in, self.z_bias, self.y_out = (t.index_select(0, index) for t in (self.z_in, self.z_bias, self.y_out))

    def step(self, h: torch.Tensor, emb_scores: torch.Tensor, enc: EncoderOut, need_attn: bool):
        """``h (B, beam, C)``, ``emb_scores = g . z (B, beam, S)`` -> ``(out (B, beam, C), attn or None)``."""
        scores = (torch.baddbmm(emb_scores + self.z_bias.unsqueeze(1), h, self.z_in.transpose(1, 2))) * SQRT_HALF
        acc = torch.promote_types(scores.dtype, torch.float32)
        scores = scores.to(acc).masked_fill(enc.pad_mask.unsqueeze(1), float("-inf"))
        attn = torch.softmax(scores, dim=-1).to(h.dtype)
        scale = enc.src_lengths.to(h.dtype).sqrt().view(-1, 1, 1)
        out = (torch.bmm(attn * scale, self.y_out) + self.b_out + h) * SQRT_HALF
        return out, (attn if need_attn else None)


class DecoderState:
    """Incremental decoding state: per-layer conv FIFOs, the encoder outputs and the step count.

    ``conv_states[i]`` is ``(N, k_i - 1, C_in_i)`` (oldest first, zeros before the first step).
    :meth:`reorder` records the parent row of each new row; the next step's fused
    ``conv_step`` applies it while shifting, so reordering costs no extra pass over memory.
    """

    def __init__(self, encoder_out: EncoderOut, beam: int, conv_states: List[torch.Tensor],
                 folded: Optional[List[Optional[FoldedAttention]]] = None):
        self.encoder_out = encoder_out
        self.beam = beam
        self.conv_states = conv_states
        self.folded = folded  # per decoder layer, with fold_attention
        self.step = 0
        self.pending_index: Optional[torch.Tensor] = None
        self.vocab = None  # a convs2s.shortlist.VocabSubset: score only these target words
        self.fused_ok: Optional[bool] = None  # whether convs2s.fused_step ran this state's first step
        self.fused_weights = None
        self.fused_layers = None  # (key, StepLayers) of this state (convs2s.fused_step)
        self.calls = BoundCalls()  # the step's ops, checked once per row count (convs2s.fused_step)
        # static mode (make_static): what changes from step to step lives in tensors written in place
        self.static = False
        self.position: Optional[torch.Tensor] = None  # (1,) int64, the next step's position
        self.parents: Optional[torch.Tensor] = None  # (N,) int64, the next step's parent rows
        self._parents_pending = False  # whether `parents` holds a reorder the next step has not applied

    @property
    def num_rows(self) -> int:
        return self.encoder_out.z.shape[0] * self.beam

    def make_static(self) -> None:
        """Fixed buffers for a recorded step (:mod:`convs2s.step_graph`): the pending reorder is
        applied to the conv states now, and from here the position and the parent rows are
        tensors written in place, the conv states are overwritten in place, and the step
        count is advanced by :meth:`static_step_done`, so that a replayed step reads its
        changing inputs from memory rather than from Python values it was recorded with.
        Sentences leaving (:meth:`reorder` with ``sentence_index``) end static mode. A static
        state is stepped by :class:`convs2s.recorded_search.RecordedSearchStep` (which writes the
        parents itself); a ``decode_step`` on it otherwise needs :meth:`static_step_ready` before
        and :meth:`static_step_done` after."""
        if self.static:
            return
        if self.pending_index is not None:
            self.conv_states = [s.index_select(0, self.pending_index) for s in self.conv_states]
            self.pending_index = None
        device = self.encoder_out.z.device
        self.position = torch.full((1,), PAD + self.step + 1, dtype=torch.long, device=device)
        self.parents = torch.arange(self.num_rows, device=device)
        self._parents_pending = False
        self.static = True

    def static_step_ready(self) -> None:
        """Before a static step: the parents buffer holds this step's parents (itself if no reorder)."""
        if not self._parents_pending:
            torch.arange(self.num_rows, out=self.parents)

    def static_step_done(self, parents_written: bool = False) -> None:
        """After a static step (run, recorded or replayed): its parents are applied, one step more;
        ``parents_written``: the step wrote the next step's parents into the buffer itself."""
        self._parents_pending = parents_written
        self.step += 1

    def _leave_static(self) -> None:
        if self._parents_pending:
            self.pending_index = self.parents.clone()
        self.static, self.position, self.parents, self._parents_pending = False, None, None, False

    def reorder(self, beam_index: torch.Tensor, sentence_index: Optional[torch.Tensor] = None) -> None:
        """Follow the chosen parents: new row ``n`` continues old row ``beam_index[n]``.

        ``sentence_index`` (B_new,) keeps only those sentences' encoder outputs (finished sentences
        dropped); every parent must then belong to the sentence at the same new position.
        """
        beam_index = beam_index.long()
        if self.static and sentence_index is None:
            if beam_index.shape[0] != self.num_rows:
                raise ValueError(f"reorder gives {beam_index.shape[0]} rows but the state has {self.num_rows}")
            if self._parents_pending:  # two reorders before a step: compose them
                beam_index = self.parents.index_select(0, beam_index)
            self.parents.copy_(beam_index)
            self._parents_pending = True
            return
        if self.static:
            self._leave_static()
        if self.pending_index is not None:
            beam_index = self.pending_index.index_select(0, beam_index)
        self.pending_index = beam_index
        if sentence_index is not None:
            self.encoder_out = self.encoder_out.index_select(sentence_index.long())
            for f in self.folded or ():
                if f is not None:
                    f.index_select(sentence_index.long())
        if beam_index.shape[0] != self.num_rows:
            raise ValueError(
                f"reorder gives {beam_index.shape[0]} rows but the state has "
                f"{self.encoder_out.z.shape[0]} sentences x beam {self.beam}"
            )


class Decoder(nn.Module):
    # Run a step's layers in one C++ call (convs2s.fused_step) where the cpp backend may run it;
    # False keeps the Python loop (same outputs, for comparisons).
    fused_step = True

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

    def _output(self, x, backend: Optional[str] = NO_DISPATCH, vocab=None, state: Optional[DecoderState] = None):
        """fc2, dropout, fc3 (or a shortlist's rows); a decoding step's ``state`` binds its calls."""
        x = self._linear("fc2", x, backend, state)
        x = F.dropout(x, self.dropout, self.training)
        if vocab is not None:  # a shortlist (convs2s.shortlist.VocabSubset): only its rows are scored
            return vocab.logits(x, backend)
        return self._linear("fc3", x, backend, state)

    def _linear(self, name: str, x, backend: Optional[str], state: Optional[DecoderState]):
        module = getattr(self, name)
        return apply_linear(module, x, backend) if state is None else step_linear(state, name, module, x, backend)

    def forward(self, prev_output_tokens: torch.Tensor, encoder_out: EncoderOut, need_attn: bool = True,
                backend: Optional[str] = None) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
        """Full-sequence forward: ``prev_output_tokens (B, T)`` (EOS first, right-padded) ->
        ``(logits (B, T, V), attention averaged over layers (B, T, S) or None)``."""
        check_tokens("prev_output_tokens", prev_output_tokens, self.vocab_size, self.max_positions)
        tokens = prev_output_tokens.long()
        x = self.embed_tokens(tokens) + self.embed_positions(make_positions(tokens, PAD))
        x = F.dropout(x, self.dropout, self.training)
        target_embedding = x
        x = self.fc1(x)
        residuals = [x]
        avg_attn = None
        num_layers = len(self.convolutions)
        for proj, conv, attention, r in zip(self.projections, self.convolutions, self.attention, self.residuals):
            residual = residual_input(residuals, proj, r)
            x = F.dropout(x, self.dropout, self.training)
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
        return self._output(x), avg_attn

    def _step_weights_on_huge_pages(self) -> None:
        """The Linear weights every step streams (fc1, the residual projections, fc2, fc3) moved
        once onto huge pages (convs2s_kernels.huge_pages): past the rows measured for the packed kernel
        the GEMM reads them; the packed copies (WeightNormed.step_packed) are made there."""
        for module in step_weight_modules(self):
            if isinstance(module, Linear) and not module.weight_normed:
                move_to_huge_pages(module.weight)

    def init_state(self, encoder_out: EncoderOut, beam: int = 1, fold_attention: bool = False,
                   backend: Optional[str] = None) -> DecoderState:
        """A fresh state for ``B * beam`` rows (beams of a sentence adjacent).

        ``fold_attention`` precomputes each attention layer's projections of the encoder outputs
        (:class:`FoldedAttention`, its products on ``backend``): the same function up to rounding,
        fewer FLOPs per step.
        """
        rows = encoder_out.z.shape[0] * beam
        ref = encoder_out.z
        if ref.device.type == "cpu" and not self.training:
            # which row counts run the few-row kernels, measured for this decoder's weights
            # (once per machine, then cached; convs2s_kernels.tune)
            ensure_kernel_choice(step_weight_shapes(self) + (fold_weight_shapes(self) if fold_attention else []))
            self._step_weights_on_huge_pages()
        states = [
            ref.new_zeros(rows, conv.kernel_width - 1, conv.in_channels) for conv in self.convolutions
        ]
        folded = None
        if fold_attention:
            with torch.no_grad():
                folded = [FoldedAttention(a, encoder_out, backend) if a is not None else None for a in self.attention]
        return DecoderState(encoder_out, beam, states, folded)

    def forward_step(self, tokens: torch.Tensor, state: DecoderState, need_attn: bool = True,
                     backend: Optional[str] = None) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
        """One decoding step: ``tokens (N,)``, the previous output of each row (EOS at step 0).

        Returns ``(logits (N, V), averaged attention (N, S) or None)`` and advances ``state``
        (a static state's tensors only: see :meth:`DecoderState.make_static`).
        """
        N = state.num_rows
        if tokens.dim() != 1 or tokens.shape[0] != N:
            raise ValueError(f"tokens must have shape ({N},) for {N} rows, got {tuple(tokens.shape)}")
        position = PAD + state.step + 1
        if position >= self.embed_positions.num_embeddings:
            raise ValueError(f"step {state.step} is past the position table ({self.max_positions} positions)")
        check_tokens("tokens", tokens.view(-1, 1), self.vocab_size, 1)
        enc = state.encoder_out
        B, beam = enc.z.shape[0], state.beam
        # static mode: the position from its tensor (a recorded step must not keep a Python number)
        pos = F.embedding(state.position, self.embed_positions.weight) if state.static \
            else self.embed_positions.weight[position]
        x = self.embed_tokens(tokens.long()) + pos
        x = F.dropout(x, self.dropout, self.training)
        target_embedding = x
        # Projections of a step see only a few rows: they go through the dispatcher (``linear``),
        # whose cpp kernel streams the weight once instead of packing it for a GEMM.
        x = self._linear("fc1", x, backend, state)
        parents = state.parents if state.static else state.pending_index
        emb_scores = None
        if state.folded is not None:  # g . z_s, shared by every attention layer
            emb_scores = torch.bmm(target_embedding.view(B, beam, -1), enc.z.transpose(1, 2))
            # every layer in one call (convs2s_kernels.decoder_step) when its cpp backend may run
            # the step (same kernels); decided at the state's first step
            if state.fused_ok is None:
                state.fused_ok = fused_step_reason(self, x, emb_scores, state, backend) is None
        if state.fused_ok and not state.static:  # the one-call step replaces the conv states' tensors
            x, avg_attn = fused_layers_step(self, x, emb_scores, state, parents, need_attn)
        else:
            x, avg_attn = self._layers_step(x, target_embedding, emb_scores, state, parents, need_attn, backend)
        if state.static:
            state.position.add_(1)  # the Python step count: state.static_step_done(), outside the step
        else:
            state.pending_index = None
            state.step += 1
        return self._output(x, backend, state.vocab, state), avg_attn

    def _layers_step(self, x, target_embedding, emb_scores, state: DecoderState, parents, need_attn: bool,
                     backend: Optional[str]) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
        """The decoder layers of one step, op by op (each dispatched); advances the conv states."""
        enc = state.encoder_out
        B, beam, N = enc.z.shape[0], state.beam, state.num_rows
        residuals, avg_attn, num_layers = [x], None, len(self.convolutions)
        for i, (proj, conv, attention, r) in enumerate(
            zip(self.projections, self.convolutions, self.attention, self.residuals)
        ):
            residual = residual_input(residuals, proj, r, backend)
            x = F.dropout(x, self.dropout, self.training)
            x, new_state = conv.step(x, state.conv_states[i], parents, backend)
            if state.static:
                state.conv_states[i].copy_(new_state)  # the buffer a recorded step reads next time
            else:
                state.conv_states[i] = new_state
            if attention is not None:
                # A sentence's beams are its queries: (N, C) -> (B, beam, C) against one encoder copy.
                h = x.view(B, beam, -1)
                if state.folded is not None:
                    out, attn = state.folded[i].step(h, emb_scores, enc, need_attn)
                else:
                    out, attn = attention(h, target_embedding.view(B, beam, -1), enc, need_attn, backend)
                x = out.reshape(N, -1)
                if attn is not None:
                    attn = attn.reshape(N, -1) / num_layers
                    avg_attn = attn if avg_attn is None else avg_attn + attn
            if residual is not None:
                x = (x + residual) * SQRT_HALF
            residuals.append(x)
        return x, avg_attn
