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

from collections import defaultdict
from typing import Callable, Dict, List, Optional, Sequence

import torch

from .encoder import EOS, PAD
from .model import ConvS2SModel

UNK = 3


def _check_sources(sources: Sequence[Sequence[int]], vocab_size: int, max_len: int) -> List[List[int]]:
    if isinstance(sources, torch.Tensor):
        raise TypeError("sources must be a list of token-id lists (one per sentence, without EOS), not a tensor")
    out = []
    for i, s in enumerate(sources):
        ids = [int(t) for t in s]
        if len(ids) + 1 > max_len:
            raise ValueError(
                f"source {i} has {len(ids)} tokens; with EOS the model accepts at most {max_len - 1}"
            )
        bad = [t for t in ids if t < 0 or t >= vocab_size]
        if bad:
            raise ValueError(f"source {i} has token ids outside the vocabulary [0, {vocab_size - 1}]: {bad[:5]}")
        out.append(ids + [EOS])
    return out


def length_batches(lengths: Sequence[int], batch_size: int, max_tokens: Optional[int] = None) -> List[List[int]]:
    """Indices grouped by equal length, each group cut into batches of at most ``batch_size``
    sentences and ``max_tokens`` tokens; batches ordered by length (shortest first)."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    groups: Dict[int, List[int]] = defaultdict(list)
    for i, L in enumerate(lengths):
        groups[L].append(i)
    batches = []
    for L in sorted(groups):
        cap = batch_size if max_tokens is None else max(1, min(batch_size, max_tokens // max(L, 1)))
        idx = groups[L]
        batches.extend(idx[j : j + cap] for j in range(0, len(idx), cap))
    return batches


@torch.no_grad()
def generate(
    model: ConvS2SModel,
    sources: Sequence[Sequence[int]],
    *,
    beam: int = 5,
    nbest: int = 1,
    max_len_a: float = 0.0,
    max_len_b: int = 200,
    min_len: int = 1,
    lenpen: float = 1.0,
    unkpen: float = 0.0,
    batch_size: int = 128,
    max_tokens: Optional[int] = None,
    return_attention: bool = False,
    progress: bool = False,
    forced_length: Optional[Sequence[int]] = None,
    fold_attention: bool = False,
    shortlist=None,
    step_hook: Optional[Callable[[int], None]] = None,
) -> List[List[dict]]:
    """Translate ``sources`` (token-id lists without EOS) with beam search.

    Returns, in input order, each source's n-best list of dicts: ``tokens`` (LongTensor ending
    in EOS), ``score`` (float, normalised), ``positional_scores`` (FloatTensor), and with
    ``return_attention`` ``attention`` (S x T_hyp, layer-averaged, over the unpadded source
    incl. EOS) and ``alignment`` (argmax source position per target token).

    ``forced_length`` (per source) makes every hypothesis exactly that many tokens before EOS
    (within ``max_len``): the speed benchmark uses it so that random weights do the work of a
    real translation.

    ``fold_attention`` precomputes the attention projections of the encoder outputs once per
    sentence (exact up to rounding; fewer FLOPs per step, see ``convs2s.decoder.FoldedAttention``).

    ``shortlist`` (a :class:`convs2s.shortlist.Shortlist`) scores only its candidate target words
    for each batch (vocabulary selection); the others get probability 0.

    ``step_hook(step)`` is called once a batch is encoded and its decoder state built (``step``
    = -1), then after every decoding step: benchmarks time the parts of a batch with it.
    """
    if beam < 1 or nbest < 1 or nbest > beam:
        raise ValueError(f"need 1 <= nbest <= beam, got beam={beam}, nbest={nbest}")
    if min_len < 0 or max_len_b < 0 or max_len_a < 0:
        raise ValueError("min_len, max_len_a and max_len_b must be non-negative")
    was_training = model.training
    model.eval()
    try:
        max_pos = min(model.max_positions())
        srcs = _check_sources(sources, model.src_vocab_size, max_pos)
        results: List[Optional[List[dict]]] = [None] * len(srcs)
        batches = length_batches([len(s) for s in srcs], batch_size, max_tokens)
        bar = None
        if progress:
            from tqdm.auto import tqdm

            bar = tqdm(total=len(srcs), unit="sent", desc="generate")
        device = next(model.parameters()).device
        for idx in batches:
            src = torch.tensor([srcs[i] for i in idx], dtype=torch.long, device=device)
            forced = None
            if forced_length is not None:
                forced = torch.tensor([int(forced_length[i]) for i in idx], device=device)
            hypos = _beam_search(model, src, beam, max_len_a, max_len_b, min_len, lenpen, unkpen,
                                 return_attention, forced, fold_attention, shortlist, step_hook)
            for i, h in zip(idx, hypos):
                results[i] = h[:nbest]
            if bar is not None:
                bar.update(len(idx))
        if bar is not None:
            bar.close()
        return results  # type: ignore[return-value]
    finally:
        model.train(was_training)


def _only_eos(lprobs: torch.Tensor, rows: Optional[torch.Tensor] = None) -> None:
    """Leave EOS as the only finite choice of ``rows`` (all rows when None), in place."""
    if rows is None:
        rows = slice(None)
    eos_col = lprobs[rows, EOS].clone()
    lprobs[rows] = float("-inf")
    lprobs[rows, EOS] = eos_col


def _beam_search(model, src, beam, max_len_a, max_len_b, min_len, lenpen, unkpen, need_attn, forced_len,
                 fold_attention=False, shortlist=None, step_hook=None):
    bsz, src_len = src.shape
    V = model.tgt_vocab_size
    k = min(beam, V - 1)
    max_len = min(int(max_len_a * src_len + max_len_b), model.decoder.max_positions - 1)
    device = src.device

    encoder_out = model.encode(src)
    state = model.init_decoder_state(encoder_out, k, fold_attention)
    if shortlist is not None:
        from .shortlist import VocabSubset

        ids = shortlist.candidates(src)
        if ids.numel() < 2 * k + 1:
            raise ValueError(f"the shortlist leaves {ids.numel()} target words for this batch; beam {k} needs "
                             f"at least {2 * k + 1} (raise --shortlist-top)")
        state.vocab = VocabSubset(model.decoder.fc3, ids)
    tokens = torch.full((bsz * k, max_len + 2), PAD, dtype=torch.long, device=device)
    tokens[:, 0] = EOS
    scores = torch.zeros(bsz * k, max_len + 1, device=device)
    attn = torch.zeros(bsz * k, src_len, max_len + 2, device=device) if need_attn else None
    src_lengths = encoder_out.src_lengths.repeat_interleave(k)
    finalized: List[List[dict]] = [[] for _ in range(bsz)]
    finished = [False] * bsz
    remaining = bsz
    cand_size = 2 * k
    bbsz_offsets = (torch.arange(bsz, device=device) * k).unsqueeze(1)
    cand_offsets = torch.arange(cand_size, device=device)
    cands_to_ignore = torch.zeros(bsz, k, dtype=torch.bool, device=device)
    sent_ids = torch.arange(bsz, device=device)  # original sentence of each active batch row
    if step_hook is not None:
        step_hook(-1)

    for step in range(max_len + 1):
        logits, step_attn = model.decode_step(tokens[:, step], state, need_attn=need_attn)
        lprobs = torch.log_softmax(logits.float(), dim=-1)
        lprobs[lprobs != lprobs] = float("-inf")
        lprobs[:, PAD] = float("-inf")
        lprobs[:, UNK] -= unkpen
        if step >= max_len:
            _only_eos(lprobs)
        elif step < min_len:
            lprobs[:, EOS] = float("-inf")
        if forced_len is not None and step < max_len:
            rows_len = forced_len[sent_ids].repeat_interleave(k)
            lprobs[step < rows_len, EOS] = float("-inf")
            at_length = step == rows_len  # end exactly there
            if bool(at_length.any()):
                _only_eos(lprobs, at_length)
        if attn is not None and step_attn is not None:
            attn[:, :, step + 1].copy_(step_attn)

        # BeamSearch.step: at step 0 only the first beam of each sentence is live.
        lp = lprobs.view(bsz, k, V)
        if step == 0:
            lp = lp[:, :1, :]
        else:
            lp = lp + scores.view(bsz, k, -1)[:, :, step - 1].unsqueeze(-1)
        flat = lp.reshape(bsz, -1)
        cand_scores, cand_flat = torch.topk(flat, k=min(cand_size, flat.shape[1] - 1))
        cand_beams = torch.div(cand_flat, V, rounding_mode="floor")
        cand_indices = cand_flat.fmod(V)
        cand_bbsz_idx = cand_beams + bbsz_offsets

        eos_mask = cand_indices.eq(EOS) & cand_scores.ne(float("-inf"))
        eos_mask[:, :k][cands_to_ignore] = False
        eos_bbsz_idx = cand_bbsz_idx[:, :k][eos_mask[:, :k]]
        newly_finished: List[int] = []
        if eos_bbsz_idx.numel() > 0:
            eos_scores = cand_scores[:, :k][eos_mask[:, :k]]
            newly_finished = _finalize(step, eos_bbsz_idx, eos_scores, tokens, scores, attn, src_lengths,
                                       finalized, finished, sent_ids, k, max_len, lenpen)
            remaining -= len(newly_finished)
        if remaining == 0 or step >= max_len:
            if step_hook is not None:
                step_hook(step)
            break

        if newly_finished:
            keep = torch.ones(bsz, dtype=torch.bool, device=device)
            keep[newly_finished] = False
            batch_idxs = keep.nonzero().squeeze(1)
            bsz = batch_idxs.numel()
            eos_mask, cand_beams = eos_mask[batch_idxs], cand_beams[batch_idxs]
            cand_scores, cand_indices = cand_scores[batch_idxs], cand_indices[batch_idxs]
            cands_to_ignore = cands_to_ignore[batch_idxs]
            bbsz_offsets = bbsz_offsets[:bsz]
            cand_bbsz_idx = cand_beams + bbsz_offsets
            rows = (batch_idxs.unsqueeze(1) * k + torch.arange(k, device=device)).view(-1)
            scores, tokens, src_lengths = scores[rows], tokens[rows], src_lengths[rows]
            if attn is not None:
                attn = attn[rows]
            sent_ids = sent_ids[batch_idxs]
        else:
            batch_idxs = None

        # The next beam: the first k candidates that are not EOS (nor ignored), in score order.
        eos_mask[:, :k] = ~((~cands_to_ignore) & (~eos_mask[:, :k]))
        active_mask = eos_mask.to(cand_offsets.dtype) * cand_size + cand_offsets[: eos_mask.shape[1]]
        new_ignore, active_hypos = torch.topk(active_mask, k=k, dim=1, largest=False)
        cands_to_ignore = new_ignore.ge(cand_size)[:, :k]
        active_bbsz_idx = torch.gather(cand_bbsz_idx, 1, active_hypos).view(-1)
        active_scores = torch.gather(cand_scores, 1, active_hypos)

        tokens[:, : step + 1] = tokens[:, : step + 1].index_select(0, active_bbsz_idx)
        tokens.view(bsz, k, -1)[:, :, step + 1] = torch.gather(cand_indices, 1, active_hypos)
        if step > 0:
            scores[:, :step] = scores[:, :step].index_select(0, active_bbsz_idx)
        scores.view(bsz, k, -1)[:, :, step] = active_scores
        if attn is not None:
            attn[:, :, : step + 2] = attn[:, :, : step + 2].index_select(0, active_bbsz_idx)

        # The decoder state still has the rows of before any sentence was dropped: map the
        # parents back to that numbering, and keep only the live sentences' encoder outputs.
        parents = active_bbsz_idx
        if batch_idxs is not None:
            sentence_of_row = torch.div(active_bbsz_idx, k, rounding_mode="floor")
            parents = active_bbsz_idx + (batch_idxs[sentence_of_row] - sentence_of_row) * k
        state.reorder(parents, sentence_index=batch_idxs)
        if step_hook is not None:
            step_hook(step)

    for hyps in finalized:
        hyps.sort(key=lambda h: h["score"], reverse=True)
    return finalized


def _finalize(step, bbsz_idx, eos_scores, tokens, scores, attn, src_lengths, finalized, finished, sent_ids, k,
              max_len, lenpen) -> List[int]:
    """Record the hypotheses ending in EOS at ``step``; return the batch rows of sentences now done."""
    tokens_clone = tokens.index_select(0, bbsz_idx)[:, 1 : step + 2].clone()
    tokens_clone[:, step] = EOS
    pos_scores = scores.index_select(0, bbsz_idx)[:, : step + 1].clone()
    pos_scores[:, step] = eos_scores
    pos_scores[:, 1:] = pos_scores[:, 1:] - pos_scores[:, :-1]
    norm_scores = eos_scores / (step + 1) ** lenpen
    attn_clone = attn.index_select(0, bbsz_idx)[:, :, 1 : step + 2] if attn is not None else None
    batch_rows = torch.div(bbsz_idx, k, rounding_mode="floor").tolist()
    for i, row in enumerate(batch_rows):
        sent = int(sent_ids[row])
        if len(finalized[sent]) < k:
            hypo = {"tokens": tokens_clone[i], "score": float(norm_scores[i]), "positional_scores": pos_scores[i]}
            if attn_clone is not None:
                L = int(src_lengths[bbsz_idx[i]])
                hypo_attn = attn_clone[i][-L:]  # unpadded source (left padding), EOS included
                hypo["attention"] = hypo_attn
                hypo["alignment"] = hypo_attn.argmax(dim=0)
            finalized[sent].append(hypo)
    newly = []
    for row in sorted(set(batch_rows)):
        sent = int(sent_ids[row])
        if not finished[sent] and (len(finalized[sent]) == k or step == max_len):
            finished[sent] = True
            newly.append(row)
    return newly


@torch.no_grad()
def greedy(model: ConvS2SModel, sources: Sequence[Sequence[int]], *, max_len_a: float = 0.0, max_len_b: int = 200,
           min_len: int = 1, lenpen: float = 1.0, unkpen: float = 0.0, batch_size: int = 128) -> List[dict]:
    """Greedy decoding (argmax each step), written independently of the beam search.

    Returns one hypothesis dict per source (same fields as :func:`generate`), in input order.
    """
    was_training = model.training
    model.eval()
    try:
        max_pos = min(model.max_positions())
        srcs = _check_sources(sources, model.src_vocab_size, max_pos)
        results: List[Optional[dict]] = [None] * len(srcs)
        device = next(model.parameters()).device
        for idx in length_batches([len(s) for s in srcs], batch_size):
            src = torch.tensor([srcs[i] for i in idx], dtype=torch.long, device=device)
            B, S = src.shape
            max_len = min(int(max_len_a * S + max_len_b), model.decoder.max_positions - 1)
            state = model.init_decoder_state(model.encode(src), 1)
            prev = torch.full((B,), EOS, dtype=torch.long, device=device)
            out_tokens: List[List[int]] = [[] for _ in range(B)]
            out_scores: List[List[float]] = [[] for _ in range(B)]
            done = torch.zeros(B, dtype=torch.bool, device=device)
            for step in range(max_len + 1):
                lprobs = torch.log_softmax(model.decode_step(prev, state)[0].float(), dim=-1)
                lprobs[:, PAD] = float("-inf")
                lprobs[:, UNK] -= unkpen
                if step >= max_len:
                    keep = lprobs[:, EOS].clone()
                    lprobs.fill_(float("-inf"))
                    lprobs[:, EOS] = keep
                elif step < min_len:
                    lprobs[:, EOS] = float("-inf")
                best, tok = lprobs.max(dim=-1)
                for b in (~done).nonzero().squeeze(1).tolist():
                    out_tokens[b].append(int(tok[b]))
                    out_scores[b].append(float(best[b]))
                done |= tok.eq(EOS)
                if bool(done.all()):
                    break
                prev = tok
            for b, i in enumerate(idx):
                pos = torch.tensor(out_scores[b])
                results[i] = {
                    "tokens": torch.tensor(out_tokens[b]),
                    "score": float(pos.sum() / len(out_tokens[b]) ** lenpen),
                    "positional_scores": pos,
                }
        return results  # type: ignore[return-value]
    finally:
        model.train(was_training)
