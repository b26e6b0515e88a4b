"""A whole search step recorded once and replayed (:mod:`convs2s.engine.graph`): the decoder's step,
``beam_candidates`` and ``beam_update``, with the step index a (1,) tensor the recording itself
advances, so that a replay (on CUDA, one graph launch) is the next step, not the recorded one.

One recording holds ``steps_per_graph`` consecutive steps (issue 50, item 6): a replay then costs
the host one graph launch and one look at the mailbox per that many steps. Sentences that finish
inside a replay are masked by the search's ops (their ``done`` flag), as they are between replays
until they leave. Steps too close to ``max_len`` for a whole recording run one at a time, eagerly
(at most ``steps_per_graph - 1`` a batch, and only for sentences that reach ``max_len``).

Everything the step reads or writes is a buffer that stays put for the segment: the search's
tokens, scores, attention and finished hypotheses, its ``ignore`` mask (written in place), the
decoder state in static mode (:meth:`convs2s.engine.DecoderState.make_static`), whose parent rows
the step writes for the next. Sentences leaving the batch replace those buffers and end the
segment; the search then records a new one. The first step of a batch (only a sentence's first
beam live) runs eagerly, and so does a segment's first step (the warm-up the recording needs).
"""

from __future__ import annotations

import torch

import convs2s_kernels as ck
from convs2s_kernels.internal import trusted_indices
from convs2s_kernels.ops.device_step import column, put_column

from ..special_tokens import EOS, PAD, UNK
from .graph import StepGraph, StepGraphError, warm_up


class RecordedSearchStep:
    """Steps ``step, step + 1, ...`` of a :class:`convs2s.generate._BeamSearch`, recorded on its
    current buffers (valid while they stay: :meth:`valid`), ``steps_per_graph`` steps a replay."""

    def __init__(self, search, step: int, steps_per_graph: int = 1):
        self.last_step, self.max_steps = search.max_len, search.model.decoder.max_positions
        if self.last_step >= self.max_steps:  # no step may index past the position table (steps <= max_len)
            raise ValueError(f"max_len {self.last_step} is past the position table ({self.max_steps} positions)")
        state, device = search.state, search.device
        state.make_static()
        self.state = state
        self.buffers = _buffers(search)
        self.step_t = torch.full((1,), step, dtype=torch.long, device=device)
        forced = None if search.forced_len is None else search.forced_len[search.sent_ids].repeat_interleave(search.k)
        # the step reads these locals, not the search (which holds this object): no reference cycle
        one = _step_function(search.prepared, state, search.options, search.k, search.max_len, search.finished,
                             self.buffers, self.step_t, forced, search.backend)
        self.one, self.device, self.steps_per_graph = one, device, steps_per_graph
        self.warmed = self.broken = False
        if steps_per_graph == 1:
            self.graph = StepGraph(one, search.recorder(device), device)
        else:  # the first step warms up (eagerly); the recording then holds steps_per_graph of them
            self.graph = StepGraph(_repeated(one, steps_per_graph), search.recorder(device), device, warmed=True)

    def valid(self, search) -> bool:
        """Whether the search still decodes with the buffers this recording holds."""
        return self.state.static is not None and all(a is b for a, b in zip(_buffers(search), self.buffers))

    def __call__(self, step: int) -> int:
        """Runs the steps from ``step`` on (a replay, a recording, or one eager step); returns how many."""
        if self.broken:
            raise StepGraphError("a recorded search step failed part way; its buffers cannot be decoded further")
        if step != self.state.step:
            raise ValueError(f"the recorded search is at step {self.state.step}, not {step}")
        if step >= self.max_steps:  # a replay would index past the position table
            raise ValueError(f"step {step} is past the position table ({self.max_steps} positions)")
        n = self.steps_per_graph
        if n > 1 and (not self.warmed or step + n - 1 > self.last_step):
            n = 1  # the warm-up, or a step too near max_len for a whole recording: one eager step
        self.broken = True  # until the call returns: a capture runs the steps, a failure leaves them part-way
        with trusted_indices():  # the search's own indices: a range check would read them on the host
            if n == self.steps_per_graph:
                self.graph()
            else:
                warm_up(self.one, self.device)
        self.broken, self.warmed = False, True
        for _ in range(n):
            self.state.static_step_done(parents_written=True)
        return n


def _repeated(step, times: int):
    def steps() -> None:
        for _ in range(times):
            step()

    return steps


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
