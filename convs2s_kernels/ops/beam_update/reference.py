"""The ground truth of ``beam_update``: fairseq's finalisation and beam advance, tensor op by
tensor op, with finished hypotheses kept in preallocated tensors (no host read, no data-dependent
shape: the same few ops at every step, on any device)."""

from __future__ import annotations

from typing import NamedTuple, Optional, Tuple

import torch

from ..beam_candidates.reference import BeamCandidates
from ..device_step import Step, is_device_step, put_column, written

__all__ = ["FinishedHypotheses", "beam_update_ref"]


class FinishedHypotheses(NamedTuple):
    """``beam`` slots per sentence of the batch as it started (sentence ``s`` owns rows
    ``s * beam ...``), then one scratch row per candidate (where the candidates that do not end
    are written): ``2 * B0 * beam`` rows in all."""

    tokens: torch.Tensor  # (2 B0 beam, L + 1) int64, EOS last
    pos_scores: torch.Tensor  # (2 B0 beam, L + 1) float32, each token's log-probability
    scores: torch.Tensor  # (2 B0 beam,) float32, normalised by length ** lenpen
    lengths: torch.Tensor  # (2 B0 beam,) int64
    count: torch.Tensor  # (B0,) int64 hypotheses per sentence
    done: torch.Tensor  # (B0,) bool
    attn: Optional[torch.Tensor] = None  # (2 B0 beam, S, L + 1) when attention is kept

    @classmethod
    def empty(cls, bsz: int, beam: int, max_len: int, src_len: int = 0, device=None,
              pad: int = 1) -> "FinishedHypotheses":
        """Buffers for ``bsz`` sentences at ``beam`` and up to ``max_len`` tokens before EOS;
        attention over ``src_len`` source positions when it is non-zero."""
        total = 2 * bsz * beam
        return cls(torch.full((total, max_len + 1), pad, dtype=torch.long, device=device),
                   torch.zeros(total, max_len + 1, device=device), torch.zeros(total, device=device),
                   torch.zeros(total, dtype=torch.long, device=device),
                   torch.zeros(bsz, dtype=torch.long, device=device), torch.zeros(bsz, dtype=torch.bool, device=device),
                   torch.zeros(total, src_len, max_len + 1, device=device) if src_len else None)


def _record(f: FinishedHypotheses, step: Step, sent_ids, top_eos, tokens, pos_scores, norm_scores, attn,
            at_max_len) -> None:
    """Keep each EOS candidate (in score order) while its sentence has fewer than ``beam``
    hypotheses; a sentence is done with ``beam`` of them, or at ``max_len`` (fairseq's rules).
    A tensor ``step`` writes whole rows (past a hypothesis' length: whatever the search's buffers
    and the score differences give there, never read) and takes the length from the tensor."""
    B, k = top_eos.shape
    slots = f.count.shape[0] * k
    active = ~f.done[sent_ids]
    slot = f.count[sent_ids].unsqueeze(1) + top_eos.long().cumsum(1) - 1
    keep = top_eos & (slot < k) & active.unsqueeze(1)
    scratch = torch.arange(slots, slots + B * k, device=top_eos.device).view(B, k)
    dest = torch.where(keep, sent_ids.unsqueeze(1) * k + slot, scratch).view(-1)
    written(f.tokens, step, 1).index_copy_(0, dest, tokens)
    written(f.pos_scores, step, 1).index_copy_(0, dest, pos_scores)
    f.scores.index_copy_(0, dest, norm_scores.reshape(-1))
    if is_device_step(step):
        f.lengths.index_copy_(0, dest, (step + 1).expand(dest.shape[0]))
    else:
        f.lengths.index_fill_(0, dest, step + 1)
    if f.attn is not None:
        written(f.attn, step, 1).index_copy_(0, dest, attn)
    count = f.count[sent_ids] + keep.sum(1)
    f.count.index_copy_(0, sent_ids, count)
    newly = active & ((count >= k) | at_max_len)
    f.done.index_copy_(0, sent_ids, f.done[sent_ids] | newly)


def _finalize(c: BeamCandidates, step: Step, k, tokens, scores, attn, sent_ids, f, lenpen, at_max_len, eos,
              offsets) -> None:
    """The EOS candidates among each sentence's best ``k``, with their parents' prefixes (a
    tensor ``step``: whole rows, the step's column by index)."""
    parents = (c.beams + offsets)[:, :k].reshape(-1)
    eos_scores = c.scores[:, :k]
    fin_tokens = written(tokens.index_select(0, parents)[:, 1:], step, 1)
    put_column(fin_tokens, step, torch.full_like(parents, eos))
    pos = written(scores.index_select(0, parents), step, 1)
    put_column(pos, step, eos_scores.reshape(-1))
    pos[:, 1:] = pos[:, 1:] - pos[:, :-1]
    fin_attn = written(attn.index_select(0, parents)[:, :, 1:], step, 1) if attn is not None else None
    if is_device_step(step):
        # (step + 1) ** lenpen in double, as Python computes it for an int step: the same scores on a
        # CPU; on CUDA within an ulp (its eager division by a scalar multiplies by the reciprocal)
        norm = eos_scores / (step + 1).double().pow(lenpen).to(eos_scores.dtype)
    else:
        norm = eos_scores / (step + 1) ** lenpen
    _record(f, step, sent_ids, c.eos_mask[:, :k], fin_tokens, pos, norm, fin_attn, at_max_len)


def _advance(step: Step, active, parents, cands: BeamCandidates, tokens, scores, attn) -> None:
    """Every beam to its chosen candidate: the written prefixes gathered by parent, the new
    token and running score appended (a tensor ``step``: whole rows, the column by index)."""
    for t, past in ((tokens, 1), (scores, 0), (attn, 2)):
        if t is not None:
            prefix = written(t, step, past)
            prefix.copy_(prefix.index_select(0, parents))
    put_column(tokens, step + 1, torch.gather(cands.tokens, 1, active).view(-1))
    put_column(scores, step, torch.gather(cands.scores, 1, active).view(-1))


def beam_update_ref(cands: BeamCandidates, step: Step, tokens: torch.Tensor, scores: torch.Tensor,
                    ignore: torch.Tensor, sent_ids: torch.Tensor, finished: FinishedHypotheses, *, lenpen: float = 1.0,
                    at_max_len: bool = False, attn: Optional[torch.Tensor] = None,
                    eos: int = 2) -> Tuple[torch.Tensor, torch.Tensor]:
    """Record the finished hypotheses of ``cands`` (EOS among each sentence's first ``beam``) in
    ``finished``, then advance: each sentence's next ``beam`` rows are its first candidates that
    neither end nor are ignored, in score order (then the others); in place on ``tokens (N, L+2)``
    (EOS first), ``scores (N, L+1)`` (running scores) and ``attn (N, S, L+2)``.

    ``ignore (B, beam)`` bool: fairseq's ``cands_to_ignore``; ``sent_ids (B,)``: each batch row's
    sentence in ``finished``. ``step`` is an int or a (1,) int64 tensor (a step the device counts,
    never 0), with ``at_max_len`` then a (1,) bool tensor too: the same hypotheses, nothing read
    on the host. Returns ``(parents (N,), ignore (B, beam))``: the row each new row
    continues (for the decoder state) and the next step's ``ignore``.
    """
    B, k = ignore.shape
    offsets = (torch.arange(B, device=tokens.device) * k).unsqueeze(1)
    _finalize(cands, step, k, tokens, scores, attn, sent_ids, finished, lenpen, at_max_len, eos, offsets)
    C = cands.scores.shape[1]
    blocked = cands.eos_mask.clone()
    blocked[:, :k] |= ignore
    order = blocked.long() * (2 * k) + torch.arange(C, device=tokens.device)
    new_ignore, active = torch.topk(order, k=k, dim=1, largest=False)
    parents = torch.gather(cands.beams + offsets, 1, active).view(-1)
    _advance(step, active, parents, cands, tokens, scores, attn)
    return parents, new_ignore.ge(2 * k)
