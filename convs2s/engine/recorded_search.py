"""A whole search step recorded once and replayed (:mod:`convs2s.engine.graph`): the decoder's step,
``beam_candidates`` and ``beam_update``, with the step index a (1,) tensor the recording itself
advances, so that a replay (on CUDA, one graph launch) is the next step, not the recorded one.

Everything the step reads or writes is a buffer that stays put for the segment: the search's
tokens, scores, attention and finished hypotheses, its ``ignore`` mask (written in place), the
decoder state in static mode (:meth:`convs2s.engine.DecoderState.make_static`), whose parent rows
the step writes for the next. Sentences leaving the batch replace those buffers and end the
segment; the search then records a new one. The first step of a batch (only a sentence's first
beam live) runs eagerly.
"""

from __future__ import annotations

import torch

import convs2s_kernels as ck
from convs2s_kernels.internal import trusted_indices
from convs2s_kernels.ops.device_step import column, put_column

from ..special_tokens import EOS, PAD, UNK
from .graph import StepGraph


class RecordedSearchStep:
    """Steps ``step, step + 1, ...`` of a :class:`convs2s.generate._BeamSearch`, recorded on its
    current buffers (valid while they stay: :meth:`valid`)."""

    def __init__(self, search, step: int):
        state, device = search.state, search.device
        state.make_static()
        self.state, self.max_steps = state, search.model.decoder.max_positions
        self.buffers = _buffers(search)
        self.step_t = torch.full((1,), step, dtype=torch.long, device=device)
        forced = None if search.forced_len is None else search.forced_len[search.sent_ids].repeat_interleave(search.k)
        # the step reads these locals, not the search (which holds this object): no reference cycle
        fn = _step_function(search.prepared, state, search.options, search.k, search.max_len, search.finished,
                            self.buffers, self.step_t, forced, search.backend)
        self.graph = StepGraph(fn, search.recorder(device), device)

    def valid(self, search) -> bool:
        """Whether the search still decodes with the buffers this recording holds."""
        return self.state.static is not None and all(a is b for a, b in zip(_buffers(search), self.buffers))

    def __call__(self, step: int) -> None:
        if step != self.state.step:
            raise ValueError(f"the recorded search is at step {self.state.step}, not {step}")
        if step >= self.max_steps:  # a replay would index past the position table
            raise ValueError(f"step {step} is past the position table ({self.max_steps} positions)")
        with trusted_indices():  # the search's own indices: a range check would read them on the host
            self.graph()
        self.state.static_step_done(parents_written=True)


def _buffers(search) -> tuple:
    """Every tensor a recorded step reads or writes in place: the search's tokens, scores,
    attention, ignore mask and sentence ids, then the static state's position, parents and conv
    states."""
    state = search.state
    return (search.tokens, search.scores, search.attn, search.cands_to_ignore, search.sent_ids, state.static.position,
            state.static.parents, *state.conv_states)


def _step_function(prepared, state, options, k: int, max_len: int, finished, buffers, step_t, forced, backend):
    tokens, scores, attn, ignore, sent_ids, *_ = buffers  # (the state is read through `state`)

    def step() -> None:
        logits, step_attn = prepared.decode_step(column(tokens, step_t), state, need_attn=options.return_attention)
        if attn is not None and step_attn is not None:
            put_column(attn, step_t + 1, step_attn)
        cands = ck.beam_candidates(logits, column(scores, step_t - 1), beam=k, step=step_t, max_len=max_len,
                                   min_len=options.min_len, unkpen=options.unkpen, forced_len=forced, ignore=ignore,
                                   pad=PAD, eos=EOS, unk=UNK, backend=backend)
        parents, new_ignore = ck.beam_update(cands, step_t, tokens, scores, ignore, sent_ids, finished,
                                             lenpen=options.lenpen, at_max_len=step_t == max_len, attn=attn, eos=EOS,
                                             backend=backend)
        ignore.copy_(new_ignore)
        state.static.parents.copy_(parents)
        step_t.add_(1)

    return step
