"""A prepared model's decoding step: the decoder's function on rows grouped per sentence.

Rows are ``N = B * beam`` (a sentence's beams adjacent), so the encoder outputs are kept once per
sentence and attention treats a sentence's beams as its queries (fairseq's BeamableMM). The beam
reorder is applied by the next step's fused ``conv_step`` while it shifts the windows. Three
programs compute it, the same function up to rounding: the op-by-op loop below, the one-call cpp
step (:mod:`convs2s.engine.fused`) and a recorded step (:mod:`convs2s.engine.graph`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional, Tuple

import torch
import torch.nn.functional as F

from convs2s_kernels.huge_pages import move_to_huge_pages
from convs2s_kernels.tune import ensure as ensure_kernel_choice

from ..encoder import EncoderOut
from ..layers import SQRT_HALF, Linear, residual_input
from .fused import fused_layers_step, fused_step_reason, step_linear
from .shapes import fold_weight_shapes, step_weight_modules, step_weight_shapes
from .state import DecoderState, FoldedAttention, FusedData
from .weights import conv_step

if TYPE_CHECKING:
    from .prepared import PreparedModel


def _step_weights_on_huge_pages(prepared: "PreparedModel") -> None:
    """The Linear weights every step streams (fc1, the residual projections, fc2, fc3) moved once
    onto huge pages (convs2s_kernels.huge_pages): past the rows measured for the packed kernel the
    GEMM reads them; their packed copies (DerivedWeights.step_packed) are made there."""
    for module in step_weight_modules(prepared.model.decoder):
        if isinstance(module, Linear) and not module.weight_normed:
            move_to_huge_pages(module.weight)


def init_state(prepared: "PreparedModel", encoder_out: EncoderOut, beam: int = 1,
               fold_attention: bool = False) -> DecoderState:
    """A fresh state for ``B * beam`` rows. ``fold_attention`` precomputes each attention layer's
    projections of the encoder outputs (:class:`FoldedAttention`): the same function up to
    rounding, fewer FLOPs per step."""
    decoder = prepared.model.decoder
    rows = encoder_out.z.shape[0] * beam
    ref = encoder_out.z
    if ref.device.type == "cpu" and not decoder.training:
        # which row counts run the few-row kernels, measured for these weights (once per machine)
        ensure_kernel_choice(step_weight_shapes(prepared) + (fold_weight_shapes(prepared) if fold_attention else []))
        _step_weights_on_huge_pages(prepared)
    windows = [ref.new_zeros(rows, conv.kernel_width - 1, conv.in_channels) for conv in decoder.convolutions]
    folded = None
    if fold_attention:
        d = prepared.derived
        with torch.no_grad():
            folded = [None if a is None else FoldedAttention(d(a.in_projection), d(a.out_projection), encoder_out,
                                                             prepared.backend)
                      for a in decoder.attention]
    return DecoderState(encoder_out, beam, windows, folded)


def decode_step(prepared: "PreparedModel", tokens: torch.Tensor, state: DecoderState,
                need_attn: bool = True) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """One step: ``tokens (N,)``, each row's previous output (EOS at step 0) -> ``(logits (N, V),
    averaged attention (N, S) or None)``; advances ``state`` (a static state's tensors only:
    :meth:`DecoderState.make_static`)."""
    decoder, backend = prepared.model.decoder, prepared.backend
    position = decoder.step_position(tokens, state.num_rows, state.step)
    enc = state.encoder_out
    B, beam = enc.z.shape[0], state.beam
    # static mode: the position from its tensor (a recorded step must not keep a Python number)
    pos = F.embedding(state.static.position, decoder.embed_positions.weight) if state.static \
        else decoder.embed_positions.weight[position]
    x = decoder.embed_tokens(tokens.long()) + pos
    x = F.dropout(x, decoder.dropout, decoder.training)
    target_embedding = x
    # A step's products see only a few rows: they go through the dispatcher (``linear``), whose cpp
    # kernel streams the weight once instead of packing it for a GEMM.
    x = step_linear(state, "fc1", prepared, decoder.fc1, x)
    parents = state.static.parents if state.static else state.pending_index
    emb_scores = None
    if state.folded is not None:  # g . z_s, shared by every attention layer
        emb_scores = torch.bmm(target_embedding.view(B, beam, -1), enc.z.transpose(1, 2))
        # every layer in one call (convs2s_kernels.decoder_step) where its cpp backend may run the
        # step (same kernels); decided at the state's first step
        if state.fused is None:
            state.fused = FusedData()
            if fused_step_reason(prepared, x, emb_scores, state) is not None:
                state.fused = False
    if state.fused and not state.static:  # the one-call step replaces the windows' tensors
        x, avg_attn = fused_layers_step(prepared, x, emb_scores, state, parents, need_attn)
    else:
        x, avg_attn = _layers_step(prepared, x, target_embedding, emb_scores, state, parents, need_attn)
    if state.static:
        state.static.position.add_(1)  # the Python step count: state.static_step_done(), outside the step
    else:
        state.pending_index = None
        state.step += 1
    return _output(prepared, x, state), avg_attn


def _output(prepared: "PreparedModel", x: torch.Tensor, state: DecoderState) -> torch.Tensor:
    """fc2, dropout, fc3 (or a shortlist's rows: :class:`convs2s.shortlist.VocabSubset`)."""
    decoder = prepared.model.decoder
    x = step_linear(state, "fc2", prepared, decoder.fc2, x)
    x = F.dropout(x, decoder.dropout, decoder.training)
    if state.vocab is not None:
        return state.vocab.logits(x, prepared.backend)
    return step_linear(state, "fc3", prepared, decoder.fc3, x)


def _layers_step(prepared: "PreparedModel", x, target_embedding, emb_scores, state: DecoderState, parents,
                 need_attn: bool) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """The decoder layers of one step, op by op (each dispatched); advances the windows."""
    decoder, backend, d = prepared.model.decoder, prepared.backend, prepared.derived
    enc = state.encoder_out
    B, beam, N = enc.z.shape[0], state.beam, state.num_rows
    residuals, avg_attn, num_layers = [x], None, len(decoder.convolutions)
    for i, (proj, conv, attention, r) in enumerate(
        zip(decoder.projections, decoder.convolutions, decoder.attention, decoder.residuals)
    ):
        residual = residual_input(residuals, proj, r, prepared.linear)
        x = F.dropout(x, decoder.dropout, decoder.training)
        x, window = conv_step(d(conv), x, state.conv_states[i], parents, backend)
        if state.static:
            state.conv_states[i].copy_(window)  # the buffer a recorded step reads next time
        else:
            state.conv_states[i] = window
        if attention is not None:
            # A sentence's beams are its queries: (N, C) -> (B, beam, C) against one encoder copy.
            h = x.view(B, beam, -1)
            if state.folded is not None:
                res = None if residual is None else residual.reshape(B, beam, -1)
                out, attn = state.folded[i].step(h, emb_scores, enc, need_attn, res, state.calls, (i, N, need_attn))
                residual = None  # the folded attention step added it
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
