"""Greedy and beam search over the incremental decoder, as fairseq's SequenceGenerator does it.

Every step runs one decoder step per layer (the fused ``conv_step`` op with the beam reorder
folded in); the prefix is never recomputed. Beam search follows fairseq exactly (see
``shared/notes/fairseq_fconv.md`` section 4.2): top ``2 * beam`` candidates over ``beam * V``,
end-of-sentence hypotheses finalised only from the top ``beam``, scores divided by
``length ** lenpen`` (length including EOS), a sentence done after ``beam`` finished hypotheses
or at ``max_len = min(a * S + b, max_positions - 1)`` with ``S`` the batch's source length.

Sentences are batched as in the paper's speed measurement: grouped by equal source length,
at most ``batch_size`` sentences (and optionally ``max_tokens`` source tokens) per batch;
results come back in input order.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence

import torch

import convs2s_kernels as ck
from convs2s_kernels.internal import trusted_indices
from convs2s_kernels.dispatch import BoundCalls
from convs2s_kernels.reference import search_rules_ref

from .engine import PreparedModel, prepare
from .engine.graph import recorder_factory
from .engine.recorded_search import RecordedSearchStep
from .errors import Convs2sError
from .model import ConvS2SModel
from .special_tokens import BOS, EOS, NUM_SPECIALS, PAD, UNK


class GenerationError(Convs2sError):
    """Sources or search options that generation cannot use, named in the message."""


def _check_sources(sources: Sequence[Sequence[int]], vocab_size: int, max_len: int) -> List[List[int]]:
    if isinstance(sources, torch.Tensor):
        raise TypeError("sources must be a list of token-id lists (one per sentence, without EOS), not a tensor")
    out = []
    for i, s in enumerate(sources):
        ids = [int(t) for t in s]
        if len(ids) + 1 > max_len:
            raise GenerationError(
                f"source {i} has {len(ids)} tokens; with EOS the model accepts at most {max_len - 1}"
            )
        bad = [t for t in ids if t < 0 or t >= vocab_size]
        if bad:
            raise GenerationError(f"source {i} has token ids outside the vocabulary [0, {vocab_size - 1}]: {bad[:5]}")
        if any(t in (BOS, PAD, EOS) for t in ids):  # a PAD inside breaks the encoder; an EOS ends the source early
            raise GenerationError(f"source {i} holds a special symbol's id ({BOS} <s>, {PAD} <pad> or {EOS} </s>) "
                                  "inside the sentence; sources are words only (EOS is appended)")
        out.append(ids + [EOS])
    return out


def length_batches(lengths: Sequence[int], batch_size: int, max_tokens: Optional[int] = None) -> List[List[int]]:
    """Indices grouped by equal length, each group cut into batches of at most ``batch_size``
    sentences and ``max_tokens`` tokens; batches ordered by length (shortest first)."""
    if batch_size < 1:
        raise GenerationError(f"batch_size must be >= 1, got {batch_size}")
    groups: Dict[int, List[int]] = defaultdict(list)
    for i, L in enumerate(lengths):
        groups[L].append(i)
    batches = []
    for L in sorted(groups):
        cap = batch_size if max_tokens is None else max(1, min(batch_size, max_tokens // max(L, 1)))
        idx = groups[L]
        batches.extend(idx[j : j + cap] for j in range(0, len(idx), cap))
    return batches


@contextmanager
def _sources_in_batches(model: ConvS2SModel, sources, batch_size: int, max_tokens: Optional[int] = None):
    """The model in eval mode (restored afterwards), with ``(checked sources, batches)``: each batch
    is ``(indices into sources, (B, S) source tensor on the model's device)``."""
    was_training = model.training
    model.eval()
    try:
        srcs = _check_sources(sources, model.src_vocab_size, min(model.max_positions()))
        device = next(model.parameters()).device
        batches = ((idx, torch.tensor([srcs[i] for i in idx], dtype=torch.long, device=device))
                   for idx in length_batches([len(s) for s in srcs], batch_size, max_tokens))
        yield srcs, batches
    finally:
        model.train(was_training)


@dataclass(frozen=True)
class SearchOptions:
    """What a search produces, as fairseq's ``generate`` options name it: ``beam`` width, ``nbest``
    hypotheses per source, ``max_len = min(max_len_a * S + max_len_b, max_positions - 1)``,
    ``min_len``, ``lenpen`` (scores divided by ``length ** lenpen``), ``unkpen`` (subtracted from
    UNK), batches of at most ``batch_size`` sentences (and ``max_tokens`` source tokens),
    ``return_attention``. ``fold_attention`` precomputes the attention projections of the encoder
    outputs once per sentence (exact up to rounding, fewer FLOPs per step:
    :class:`convs2s.engine.state.FoldedAttention`); ``shortlist`` (a
    :class:`convs2s.shortlist.Shortlist`) scores only its candidate target words per batch."""

    beam: int = 5
    nbest: int = 1
    max_len_a: float = 0.0
    max_len_b: int = 200
    min_len: int = 1
    lenpen: float = 1.0
    unkpen: float = 0.0
    batch_size: int = 128
    max_tokens: Optional[int] = None
    return_attention: bool = False
    fold_attention: bool = False
    shortlist: object = None

    def check(self) -> "SearchOptions":
        """These options, or a :class:`GenerationError` naming what no search can take."""
        if self.beam < 1 or self.nbest < 1 or self.nbest > self.beam:
            raise GenerationError(f"need 1 <= nbest <= beam, got beam={self.beam}, nbest={self.nbest}")
        if self.min_len < 0 or self.max_len_b < 0 or self.max_len_a < 0:
            raise GenerationError("min_len, max_len_a and max_len_b must be non-negative")
        return self

    def max_len(self, model: ConvS2SModel, src_len: int) -> int:
        """fairseq's ``min(a * S + b, max_positions - 1)`` for a batch of source length ``S``."""
        return min(int(self.max_len_a * src_len + self.max_len_b), model.decoder.max_positions - 1)


# Steps one recording holds: the host's per-replay work (a launch, the mailbox) spread over four
# steps. The price: a batch decodes a few steps after its last sentence is done (up to 2 x 4 - 1
# on a GPU, whose news of it comes a call late), never past max_len.
STEPS_PER_GRAPH = 4


@dataclass
class Observer:
    """What a benchmark or a test asks of a search besides its translations.

    ``forced_length`` (per source) makes every hypothesis exactly that many tokens before EOS
    (within ``max_len``), so that random weights do a real translation's work; ``on_step(step)``
    is called once a batch is encoded and its state built (``step`` = -1), then after every step;
    ``search_backend`` is the backend request of the search's ops (``beam_candidates``,
    ``beam_update``; None: the model's); ``cuda_graph`` (:func:`convs2s.engine.graph.recorder_factory`):
    None records every step after a batch's first as a CUDA graph on CUDA and replays it, False
    decodes eagerly, ``"record-ops"`` holds the step to a graph's contract on any device;
    ``steps_per_graph``: how many steps one recording holds (one graph launch, and one look at
    which sentences are done, per that many steps: :mod:`convs2s.engine.recorded_search`)."""

    forced_length: Optional[Sequence[int]] = None
    on_step: Optional[Callable[[int], None]] = None
    search_backend: Optional[str] = None
    cuda_graph: object = None
    steps_per_graph: int = STEPS_PER_GRAPH

    def check(self) -> "Observer":
        if isinstance(self.steps_per_graph, bool) or not isinstance(self.steps_per_graph, int) \
                or self.steps_per_graph < 1:
            raise GenerationError(f"steps_per_graph must be an int >= 1, got {self.steps_per_graph!r}")
        return self


def search_options(options: Optional[SearchOptions] = None, **fields) -> SearchOptions:
    """``options`` (default :class:`SearchOptions`) with ``fields`` replaced; an unknown field is
    named in one line."""
    names = {f.name for f in dataclasses.fields(SearchOptions)}
    unknown = sorted(set(fields) - names)
    if unknown:
        hooks = {f.name for f in dataclasses.fields(Observer)} | {"step_hook"}
        where = "; measurement hooks go in observer=Observer(...)" if set(unknown) & hooks else ""
        raise TypeError(f"unknown search option(s) {', '.join(unknown)}: choose from {', '.join(sorted(names))}{where}")
    return dataclasses.replace(options or SearchOptions(), **fields)


@torch.no_grad()
def generate(model, sources: Sequence[Sequence[int]], options: Optional[SearchOptions] = None, *,
             observer: Optional[Observer] = None, progress: bool = False, **fields) -> List[List[dict]]:
    """Translate ``sources`` (token-id lists without EOS) with beam search, on ``model`` (a
    :class:`ConvS2SModel`, decoded on its preparation :func:`convs2s.engine.prepare`, or a
    :class:`convs2s.engine.PreparedModel`). ``options`` (:class:`SearchOptions`), with any of its
    fields given as keywords too (``generate(model, sources, beam=5)``); ``observer``
    (:class:`Observer`) for benchmarks; ``progress`` shows a bar.

    Returns, in input order, each source's n-best list of dicts: ``tokens`` (LongTensor ending
    in EOS), ``score`` (float, normalised), ``positional_scores`` (FloatTensor), and with
    ``return_attention`` ``attention`` (S x T_hyp, layer-averaged, over the unpadded source
    incl. EOS) and ``alignment`` (argmax source position per target token).
    """
    options = search_options(options, **fields).check()
    observer = (observer or Observer()).check()
    if observer.search_backend is not None:
        ck.requested_backends(observer.search_backend)  # validates the names
    prepared = prepare(model)
    model = prepared.model
    recorder_factory(observer.cuda_graph, next(model.parameters()).device)  # validates it before any work
    with _sources_in_batches(model, sources, options.batch_size, options.max_tokens) as (srcs, batches):
        return _search_batches(prepared, len(srcs), batches, options, observer, progress)


def _search_batches(prepared: PreparedModel, count: int, batches, options: SearchOptions, observer: Observer,
                    progress: bool) -> List[List[dict]]:
    """Each batch's beam search; the n-best lists in input order."""
    results: List[Optional[List[dict]]] = [None] * count
    bar = _progress_bar(count) if progress else None
    for idx, src in batches:
        lengths = observer.forced_length
        forced = None if lengths is None else _batch_lengths(lengths, idx, src.device)
        for i, h in zip(idx, _beam_search(prepared, src, options, observer, forced)):
            results[i] = h[:options.nbest]
        if bar is not None:
            bar.update(len(idx))
    if bar is not None:
        bar.close()
    return results  # type: ignore[return-value]


def _batch_lengths(lengths: Sequence[int], idx: List[int], device) -> torch.Tensor:
    return torch.tensor([int(lengths[i]) for i in idx], device=device)


def _progress_bar(total: int):
    from tqdm.auto import tqdm

    return tqdm(total=total, unit="sent", desc="generate")


def _beam_search(prepared: PreparedModel, src: torch.Tensor, options: SearchOptions, observer: Observer,
                 forced_len=None) -> List[List[dict]]:
    """One batch's sorted hypotheses per sentence (fairseq's ``SequenceGenerator._generate``).

    A step is two ops (:func:`convs2s_kernels.beam_candidates`, :func:`convs2s_kernels.beam_update`)
    after the decoder's and reads nothing back: finished hypotheses go to preallocated tensors,
    and the host learns which sentences are done through a :class:`_Mailbox` (on GPUs, without
    waiting); index ranges are the search's own, so the ops' per-call checks are skipped.
    """
    search = _BeamSearch(prepared, src, options, observer, forced_len)
    step_hook = observer.on_step
    if step_hook is not None:
        step_hook(-1)
    step = 0
    with trusted_indices():
        while True:
            if search.recorder is not None and step > 0:
                ran = search.recorded_step(step)
            else:
                search.update(step, search.candidates(step, search.logits(step)))
                ran = 1
            done_rows = search.done_rows()
            last = step + ran - 1
            over = search.all_done() or last >= search.max_len
            if not over:
                search.leave(done_rows)
            if step_hook is not None:
                for s in range(step, last + 1):
                    step_hook(s)
            if over:
                return search.results()
            step = last + 1


class _Mailbox:
    """News from the device without waiting for it: :meth:`post` queues a copy of a small tensor
    to (pinned) host memory, :meth:`read` returns the newest copy that has arrived, or None.

    On a CPU the copy arrives at once. On a GPU a new copy is queued only once the previous one
    has been read, so a slow device delays the news by a step or two but never blocks the host.
    Its host buffer is marked ``mailbox`` (tests tell its reads from round trips that wait).
    """

    def __init__(self, like: torch.Tensor):
        self.cuda = like.device.type == "cuda"
        self.host = torch.empty(like.shape, dtype=like.dtype, pin_memory=self.cuda)
        self.host.mailbox = True
        self.event = torch.cuda.Event() if self.cuda else None
        self.in_flight = False

    def post(self, tensor: torch.Tensor) -> None:
        if self.in_flight:
            return
        self.host.copy_(tensor, non_blocking=self.cuda)
        if self.cuda:
            self.event.record()
        self.in_flight = True

    def read(self) -> Optional[list]:
        if not self.in_flight or (self.cuda and not self.event.query()):
            return None
        self.in_flight = False
        return self.host.tolist()


class _BeamSearch:
    """The buffers of one batch's beam search: ``bsz * k`` rows (a sentence's beams adjacent) of
    tokens (EOS first), cumulative scores and attention; finished hypotheses in preallocated
    tensors (:class:`convs2s_kernels.FinishedHypotheses`); sentences leave the batch once the host
    knows they are done (with a recorded step, once they are half of it: :meth:`leave`)."""

    def __init__(self, prepared: PreparedModel, src: torch.Tensor, options: SearchOptions, observer: Observer,
                 forced_len=None):
        self.prepared, self.options, self.forced_len = prepared, options, forced_len
        self.model = model = prepared.model
        bsz, src_len = src.shape
        self.bsz = bsz
        self.V = model.tgt_vocab_size
        self.k = k = min(options.beam, self.V - 1)
        self.max_len = max_len = options.max_len(model, src_len)
        self.device = device = src.device
        encoder_out = prepared.encode(src)
        self.state = prepared.init_decoder_state(encoder_out, k, options.fold_attention)
        if options.shortlist is not None:
            self.state.vocab = _vocab_subset(prepared, options.shortlist, src, k)
        self.tokens = torch.full((bsz * k, max_len + 2), PAD, dtype=torch.long, device=device)
        self.tokens[:, 0] = EOS
        self.scores = torch.zeros(bsz * k, max_len + 1, device=device)
        self.attn = torch.zeros(bsz * k, src_len, max_len + 2, device=device) if options.return_attention else None
        self.finished = ck.FinishedHypotheses.empty(bsz, k, max_len, src_len if options.return_attention else 0, device,
                                                     pad=PAD)
        self.src_lengths = encoder_out.src_lengths.tolist()  # per sentence, once: trims the attention
        self.cands_to_ignore = torch.zeros(bsz, k, dtype=torch.bool, device=device)
        self.sent_ids = torch.arange(bsz, device=device)  # original sentence of each active batch row
        self.host_sent_ids = list(range(bsz))  # the same, as the host knows it (no read needed)
        self.host_done = [False] * bsz  # sentences the host knows are finished
        self.mailbox = _Mailbox(self.finished.done)
        # the search's two ops: checked at their first call for each batch size, then bound
        self.backend = observer.search_backend if observer.search_backend is not None else model.backend
        self.ops = BoundCalls()
        self.recorder = recorder_factory(observer.cuda_graph, device)
        self.steps_per_graph = observer.steps_per_graph
        self.recorded: Optional[RecordedSearchStep] = None  # steps 1+ recorded for these rows and buffers
        self.leaving: List[int] = []  # batch rows of done sentences still in the buffers

    def logits(self, step: int) -> torch.Tensor:
        """Decode one step: every row's scores of its next token (attention kept when asked)."""
        logits, step_attn = self.prepared.decode_step(self.tokens[:, step], self.state,
                                                      need_attn=self.options.return_attention)
        if self.attn is not None and step_attn is not None:
            self.attn[:, :, step + 1].copy_(step_attn)
        return logits

    def candidates(self, step: int, logits: torch.Tensor) -> ck.BeamCandidates:
        """BeamSearch.step with the search's rules (:func:`convs2s_kernels.beam_candidates`): the
        top ``2k`` over ``k * V`` per sentence; at step 0 only the first beam is live."""
        forced = None
        if self.forced_len is not None:
            forced = self.forced_len[self.sent_ids].repeat_interleave(self.k)
        return self.ops(ck.beam_candidates, (self.bsz, step == 0, forced is None), logits.device,
                        logits, self.scores[:, step - 1] if step > 0 else None, beam=self.k, step=step,
                        max_len=self.max_len, min_len=self.options.min_len, unkpen=self.options.unkpen,
                        forced_len=forced, ignore=self.cands_to_ignore, pad=PAD, eos=EOS, unk=UNK,
                        backend=self.backend)

    def update(self, step: int, cands: ck.BeamCandidates) -> None:
        """Record the finished hypotheses and advance every beam (:func:`convs2s_kernels.beam_update`,
        on the device); the decoder state follows the parents; post which sentences are done."""
        parents, self.cands_to_ignore = self.ops(
            ck.beam_update, self.bsz, self.device, cands, step, self.tokens, self.scores, self.cands_to_ignore,
            self.sent_ids, self.finished, lenpen=self.options.lenpen, at_max_len=step == self.max_len,
            attn=self.attn, eos=EOS, backend=self.backend)
        self.state.reorder(parents)
        self.mailbox.post(self.finished.done)

    def recorded_step(self, step: int) -> int:
        """Whole steps after the first, recorded (:class:`convs2s.engine.recorded_search.RecordedSearchStep`:
        the decoder's step and the search's two ops, the step counted on the device) and replayed,
        ``steps_per_graph`` a replay; post which sentences are done. Returns how many steps ran."""
        if self.recorded is None or not self.recorded.valid(self):
            self.recorded = RecordedSearchStep(self, step, self.steps_per_graph)
        ran = self.recorded(step)
        self.mailbox.post(self.finished.done)
        return ran

    def done_rows(self) -> List[int]:
        """The batch rows of sentences the host has just learnt are done (from the mailbox)."""
        news = self.mailbox.read()
        if news is None:
            return []
        rows = [row for row, sent in enumerate(self.host_sent_ids) if news[sent] and not self.host_done[sent]]
        for row in rows:
            self.host_done[self.host_sent_ids[row]] = True
        return rows

    def all_done(self) -> bool:
        return all(self.host_done)

    def leave(self, done_rows: List[int]) -> None:
        """Done sentences leave the batch: at once when the step runs eagerly; with a recorded step
        once they are half of the batch (a new row count costs a new recording). Until then their
        rows keep decoding and the search's ops ignore them (their sentences are done)."""
        self.leaving.extend(done_rows)
        if self.leaving and (self.recorder is None or 2 * len(self.leaving) >= self.bsz):
            self.drop_sentences(self.leaving)
            self.leaving = []

    def drop_sentences(self, done_rows: List[int]) -> None:
        """Remove the finished sentences' rows from every buffer and from the decoder state."""
        k = self.k
        done = set(done_rows)
        kept = [row for row in range(self.bsz) if row not in done]
        batch_idxs = torch.tensor(kept, dtype=torch.long, device=self.device)
        self.bsz = len(kept)
        self.host_sent_ids = [self.host_sent_ids[row] for row in kept]
        self.cands_to_ignore = self.cands_to_ignore[batch_idxs]
        rows = (batch_idxs.unsqueeze(1) * k + torch.arange(k, device=self.device)).view(-1)
        self.scores, self.tokens = self.scores[rows], self.tokens[rows]
        if self.attn is not None:
            self.attn = self.attn[rows]
        self.sent_ids = self.sent_ids[batch_idxs]
        self.state.reorder(rows, sentence_index=batch_idxs)

    def results(self) -> List[List[dict]]:
        """Each sentence's finished hypotheses, best first (turned into Python objects once)."""
        return _hypotheses(self.finished, self.k, self.src_lengths)


def _hypotheses(f: ck.FinishedHypotheses, k: int, src_lengths: List[int]) -> List[List[dict]]:
    """Each sentence's finished hypotheses, best first, as Python objects (once per batch)."""
    slots = f.count.shape[0] * k
    counts, scores, lengths = f.count.tolist(), f.scores[:slots].tolist(), f.lengths[:slots].tolist()
    out = []
    for sent, n in enumerate(counts):
        hyps = []
        for slot in range(sent * k, sent * k + n):
            L = lengths[slot]
            hypo = {"tokens": f.tokens[slot, :L].clone(), "score": scores[slot],
                    "positional_scores": f.pos_scores[slot, :L].clone()}
            if f.attn is not None:
                attn = f.attn[slot, -src_lengths[sent]:, :L].clone()  # unpadded source, EOS included
                hypo["attention"], hypo["alignment"] = attn, attn.argmax(dim=0)
            hyps.append(hypo)
        hyps.sort(key=lambda h: h["score"], reverse=True)
        out.append(hyps)
    return out


def _vocab_subset(prepared: PreparedModel, shortlist, src: torch.Tensor, k: int):
    """The output layer restricted to the shortlist's candidates for this batch."""
    from .shortlist import VocabSubset

    ids = shortlist.candidates(src)
    if ids.numel() < 2 * k + 1:
        raise GenerationError(f"the shortlist leaves {ids.numel()} target words for this batch; beam {k} needs "
                              f"at least {2 * k + 1} (raise --shortlist-top)")
    fc3 = prepared.model.decoder.fc3
    return VocabSubset(fc3, ids, prepared.derived(fc3))


@torch.no_grad()
def greedy(model, sources: Sequence[Sequence[int]], *, max_len_a: float = 0.0, max_len_b: int = 200,
           min_len: int = 1, lenpen: float = 1.0, unkpen: float = 0.0, batch_size: int = 128) -> List[dict]:
    """Greedy decoding (argmax each step): its own loop, independent of the beam search's
    candidate and beam bookkeeping; only the per-step rules (:func:`convs2s_kernels.reference.search_rules_ref`)
    are shared.

    Returns one hypothesis dict per source (same fields as :func:`generate`), in input order.
    """
    options = SearchOptions(beam=1, max_len_a=max_len_a, max_len_b=max_len_b, min_len=min_len, lenpen=lenpen,
                            unkpen=unkpen, batch_size=batch_size)
    prepared = prepare(model)
    with _sources_in_batches(prepared.model, sources, batch_size) as (srcs, batches):
        results: List[Optional[dict]] = [None] * len(srcs)
        for idx, src in batches:
            for i, hypo in zip(idx, _greedy_batch(prepared, src, options)):
                results[i] = hypo
        return results  # type: ignore[return-value]


def _greedy_batch(prepared: PreparedModel, src: torch.Tensor, options: SearchOptions) -> List[dict]:
    """Argmax each step; tokens and scores go to preallocated tensors (a finished row keeps
    decoding, its outputs ignored), and the host learns that every row is done by the mailbox."""
    B, S = src.shape
    max_len = options.max_len(prepared.model, S)
    state = prepared.init_decoder_state(prepared.encode(src), 1)
    prev = torch.full((B,), EOS, dtype=torch.long, device=src.device)
    tokens = torch.full((B, max_len + 1), EOS, dtype=torch.long, device=src.device)
    scores = torch.zeros(B, max_len + 1, device=src.device)
    lengths = torch.zeros(B, dtype=torch.long, device=src.device)
    done = torch.zeros(B, dtype=torch.bool, device=src.device)
    mailbox = _Mailbox(done.all())
    with trusted_indices():
        for step in range(max_len + 1):
            lprobs = torch.log_softmax(prepared.decode_step(prev, state)[0].float(), dim=-1)
            search_rules_ref(lprobs, step, max_len, options.min_len, options.unkpen, pad=PAD, eos=EOS, unk=UNK)
            best, tok = lprobs.max(dim=-1)
            tokens[:, step], scores[:, step] = tok, best
            lengths += ~done
            done |= tok.eq(EOS)
            mailbox.post(done.all())
            if mailbox.read():
                break
            prev = tok
    hypos = []
    for b, L in enumerate(lengths.tolist()):
        pos = scores[b, :L].clone()
        hypos.append({"tokens": tokens[b, :L].clone(), "score": float(pos.sum() / L ** options.lenpen),
                      "positional_scores": pos})
    return hypos


def warmup(model, *, max_source_length: int, beam: int = 5, fold_attention: bool = False,
           observer: Optional[Observer] = None, **generate_options) -> List[int]:
    """Tune, compile and record what decoding will call before anything is timed: a
    :func:`convs2s.generate` of a few steps (the first, a recording's warm-up, one recording) per
    autotune bucket and Triton specialisation of source lengths up to ``max_source_length`` (EOS
    included) and of rows (:func:`convs2s_kernels.warmup`), where Triton runs (CUDA, or a backend
    naming it); elsewhere one sentence of that length. Returns the
    source lengths run. ``generate_options`` (search options such as ``shortlist``) and
    ``observer`` (its ``cuda_graph`` and ``search_backend``) go to every call."""
    prepared = prepare(model)
    model = prepared.model
    limit = min(model.max_positions())
    if not 1 <= max_source_length <= limit:
        raise ValueError(f"max_source_length must lie in [1, {limit}] (EOS included), got {max_source_length}")
    fixed = {"max_len_b", "max_len_a", "batch_size"} & set(generate_options)
    if observer is not None and (observer.forced_length is not None or observer.on_step is not None):
        fixed.add("the observer's forced_length and on_step")
    if fixed:
        raise ValueError(f"warmup decodes a few steps per sentence itself; drop {', '.join(sorted(fixed))}")
    word = min(NUM_SPECIALS, model.src_vocab_size - 1)  # any ordinary source word
    device = next(model.parameters()).device
    steps_per_graph = (observer or Observer()).check().steps_per_graph

    def run(S: int, sentences: int) -> None:
        # the first step (eager), a recorded step's warm-up, then one recording's steps
        generate(prepared, [[word] * (S - 1)] * sentences, beam=beam, max_len_b=1 + steps_per_graph,
                 fold_attention=fold_attention, observer=observer, **generate_options)

    if device.type != "cuda" and "triton" not in (model.backend or ""):
        run(max_source_length, 1)  # nothing to tune but the cpp kernel choice, made at the first step
        return [max_source_length]
    return ck.warmup(run, max_source_length=max_source_length, device=device)
