"""The state a prepared model decodes with: per-row convolution windows, the encoder outputs and,
with folded attention, each attention layer's per-sentence products."""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Union

import torch

import convs2s_kernels as ck
from convs2s_kernels.dispatch import BoundCalls

from ..encoder import EncoderOut
from ..special_tokens import PAD
from .weights import DerivedWeights, cpp_may_run


def _or_reference(backend: Optional[str]) -> Optional[str]:
    """``backend`` for an op the cpp backend lacks (``attention_step``): the named backends, then the
    reference (the same tensor operations the step ran before the op existed)."""
    choices = ck.requested_backends(backend)
    return backend if "auto" in choices or "reference" in choices else ",".join(choices + ["reference"])


class FoldedAttention:
    """An attention layer's step-independent products, computed once per sentence (exact algebra):

    ``scores = sqrt(1/2) (h . (W_in^T z_s) + b_in . z_s + g . z_s)`` and
    ``W_out (sqrt(s) sum_s a_s y_s) + b_out = sqrt(s) sum_s a_s (W_out y_s) + b_out``,
    so a step costs ``S x C`` per row instead of the two ``E x C`` projections.
    """

    def __init__(self, inp: DerivedWeights, out: DerivedWeights, enc: EncoderOut, backend: Optional[str] = None):
        # inp, out: the layer's projections W_in (E, C) and W_out (C, E), with their derived copies
        self.backend = _or_reference(backend)
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
        self.z_in = ck.linear(enc.z, inp.weight().t(), backend=backend,
                              packed=inp.fold_packed(transposed=True) if packs else None)  # (B, S, C)
        self.y_out = ck.linear(enc.y, out.weight(), backend=backend,
                               packed=out.fold_packed() if packs else None)  # (B, S, C)

    def index_select(self, index: torch.Tensor) -> None:
        self.z_in, self.z_bias, self.y_out = (t.index_select(0, index) for t in (self.z_in, self.z_bias, self.y_out))

    def step(self, h: torch.Tensor, emb_scores: torch.Tensor, enc: EncoderOut, need_attn: bool,
             residual: Optional[torch.Tensor] = None, calls: Optional[BoundCalls] = None, key=None):
        """``h (B, beam, C)``, ``emb_scores = g . z (B, beam, S)``, the layer's ``residual (B, beam, C)``
        or None -> ``(out (B, beam, C), attn or None)``: one ``attention_step`` (one kernel on a GPU),
        through ``calls`` (checked at its first call with ``key``) where given."""
        args = (h, emb_scores, self.z_bias, self.z_in, self.y_out, self.b_out, enc.src_lengths, residual)
        if calls is None:
            return ck.attention_step(*args, need_attn=need_attn, backend=self.backend)
        return calls(ck.attention_step, key, h.device, *args, need_attn=need_attn, backend=self.backend)


@dataclass
class StaticBuffers:
    """A recorded step's changing inputs, in tensors written in place (:meth:`DecoderState.make_static`)."""

    position: torch.Tensor  # (1,) int64, the next step's position
    parents: torch.Tensor  # (N,) int64, the next step's parent rows
    pending: bool = False  # whether `parents` holds a reorder the next step has not applied


@dataclass
class FusedData:
    """The one-call step's data for one state (:mod:`convs2s.engine.fused`): the layers' weights,
    and the ``StepLayers`` with this state's folded attention (rebuilt when sentences leave)."""

    weights: Optional[list] = None
    layers: Optional[tuple] = None  # (key, StepLayers)


class DecoderState:
    """Incremental decoding state: per-layer conv FIFOs, the encoder outputs and the step count,
    and what the step's program keeps: ``fused`` (None until the first step decides; False: op by
    op; :class:`FusedData`: one C++ call) and ``static`` (None, or a recorded step's
    :class:`StaticBuffers`).

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
        self.calls = BoundCalls()  # the step's ops, checked once per row count (convs2s.engine.fused)
        self.fused: Union[None, bool, FusedData] = None
        self.static: Optional[StaticBuffers] = None

    @property
    def num_rows(self) -> int:
        return self.encoder_out.z.shape[0] * self.beam

    def make_static(self) -> None:
        """Fixed buffers for a recorded step (:mod:`convs2s.engine.graph`): the pending reorder is
        applied to the conv states now, and from here the position and the parent rows are
        tensors written in place, the conv states are overwritten in place, and the step
        count is advanced by :meth:`static_step_done`, so that a replayed step reads its
        changing inputs from memory rather than from Python values it was recorded with.
        Sentences leaving (:meth:`reorder` with ``sentence_index``) end static mode. A static
        state is stepped by :class:`convs2s.engine.recorded_search.RecordedSearchStep` (which writes the
        parents itself); a ``decode_step`` on it otherwise needs :meth:`static_step_ready` before
        and :meth:`static_step_done` after."""
        if self.static:
            return
        if self.pending_index is not None:
            self.conv_states = [s.index_select(0, self.pending_index) for s in self.conv_states]
            self.pending_index = None
        device = self.encoder_out.z.device
        self.static = StaticBuffers(torch.full((1,), PAD + self.step + 1, dtype=torch.long, device=device),
                                    torch.arange(self.num_rows, device=device))

    def static_step_ready(self) -> None:
        """Before a static step: the parents buffer holds this step's parents (itself if no reorder)."""
        if not self.static.pending:
            torch.arange(self.num_rows, out=self.static.parents)

    def static_step_done(self, parents_written: bool = False) -> None:
        """After a static step (run, recorded or replayed): its parents are applied, one step more;
        ``parents_written``: the step wrote the next step's parents into the buffer itself."""
        self.static.pending = parents_written
        self.step += 1

    def _leave_static(self) -> None:
        if self.static.pending:
            self.pending_index = self.static.parents.clone()
        self.static = None

    def reorder(self, beam_index: torch.Tensor, sentence_index: Optional[torch.Tensor] = None) -> None:
        """Follow the chosen parents: new row ``n`` continues old row ``beam_index[n]``.

        ``sentence_index`` (B_new,) keeps only those sentences' encoder outputs (finished sentences
        dropped); every parent must then belong to the sentence at the same new position.
        """
        beam_index = beam_index.long()
        if self.static and sentence_index is None:
            if beam_index.shape[0] != self.num_rows:
                raise ValueError(f"reorder gives {beam_index.shape[0]} rows but the state has {self.num_rows}")
            if self.static.pending:  # two reorders before a step: compose them
                beam_index = self.static.parents.index_select(0, beam_index)
            self.static.parents.copy_(beam_index)
            self.static.pending = True
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
