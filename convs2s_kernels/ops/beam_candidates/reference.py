"""The ground truth of ``beam_candidates``: fairseq's beam-search step, tensor op by tensor op.

Nothing here reads a tensor back to the host, so the same code serves GPUs without a round trip.
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import torch

from ..device_step import Step, is_device_step, is_first_step

__all__ = ["BeamCandidates", "search_rules_ref", "beam_candidates_ref"]

NEG_INF = float("-inf")


class BeamCandidates(NamedTuple):
    """A step's ``C = 2 * beam`` best continuations per sentence, best first, each ``(B, C)``."""

    scores: torch.Tensor  # float32 running scores (log-probability of the prefix and the token)
    tokens: torch.Tensor  # int64 token ids
    beams: torch.Tensor  # int64 parent beam within the sentence
    eos_mask: torch.Tensor  # bool: an EOS with a finite score, not among the ignored first ``beam``


def _only_eos(lprobs: torch.Tensor, eos: int, rows: Optional[torch.Tensor] = None) -> None:
    """Leave EOS as the only finite choice of the rows where the bool mask ``rows`` is True (all
    rows when None), in place, without indexing by the mask (which would read it back to the host)."""
    eos_col = lprobs[:, eos].clone()
    if rows is None:
        lprobs.fill_(NEG_INF)
        lprobs[:, eos] = eos_col
    else:
        lprobs.masked_fill_(rows.unsqueeze(1), NEG_INF)
        lprobs[:, eos] = torch.where(rows, eos_col, lprobs[:, eos])


def search_rules_ref(lprobs: torch.Tensor, step: Step, max_len: int, min_len: int, unkpen: float, *,
                     forced_len: Optional[torch.Tensor] = None, pad: int = 1, eos: int = 2, unk: int = 3) -> None:
    """The rules of every step, in place on ``lprobs (N, V)``: NaN is -inf, never PAD, UNK
    penalised by ``unkpen``, only EOS at ``max_len``, no EOS before ``min_len``; with
    ``forced_len (N,)`` no EOS before each row's length and only EOS at it (within ``max_len``).
    ``step`` is an int, or a (1,) tensor (:mod:`convs2s_kernels.ops.device_step`: the same rules
    as masks, nothing read on the host)."""
    torch.nan_to_num_(lprobs, nan=NEG_INF, posinf=float("inf"), neginf=NEG_INF)
    lprobs[:, pad] = NEG_INF
    lprobs[:, unk] -= unkpen
    if is_device_step(step):
        _device_step_rules(lprobs, step, max_len, min_len, forced_len, eos)
        return
    if step >= max_len:
        _only_eos(lprobs, eos)
    elif step < min_len:
        lprobs[:, eos] = NEG_INF
    if forced_len is not None and step < max_len:
        lprobs[:, eos].masked_fill_(step < forced_len, NEG_INF)
        _only_eos(lprobs, eos, step == forced_len)  # end exactly there


def _device_step_rules(lprobs, step: torch.Tensor, max_len: int, min_len: int, forced_len, eos: int) -> None:
    """:func:`search_rules_ref`'s step rules for a (1,) tensor ``step``."""
    rows = lprobs.shape[0]
    at_max = step >= max_len
    _only_eos(lprobs, eos, at_max.expand(rows))
    lprobs[:, eos].masked_fill_((step < min_len) & ~at_max, NEG_INF)
    if forced_len is not None:
        lprobs[:, eos].masked_fill_((step < forced_len) & ~at_max, NEG_INF)
        _only_eos(lprobs, eos, (step == forced_len) & ~at_max)


def beam_candidates_ref(logits: torch.Tensor, prev_scores: Optional[torch.Tensor], *, beam: int, step: Step,
                        max_len: int, min_len: int = 1, unkpen: float = 0.0,
                        forced_len: Optional[torch.Tensor] = None, ignore: Optional[torch.Tensor] = None,
                        pad: int = 1, eos: int = 2, unk: int = 3) -> BeamCandidates:
    """``log_softmax(logits)`` under :func:`search_rules_ref`, plus each row's running score, and
    every sentence's top ``C = min(2 * beam, live * V - 1)`` over its live beams' ``V`` tokens
    (at step 0 only the first beam is live: a sentence's beams are still identical; a tensor
    ``step`` is never 0).

    ``logits (N, V)`` with ``N = B * beam`` (a sentence's beams adjacent), ``prev_scores (N,)``
    (unused at step 0), ``ignore (B, beam)`` bool: candidates among the first ``beam`` that may
    not end (fairseq's ``cands_to_ignore``). Ties: :func:`torch.topk`'s order.
    """
    N, V = logits.shape
    B = N // beam
    lprobs = torch.log_softmax(logits.float(), dim=-1)
    search_rules_ref(lprobs, step, max_len, min_len, unkpen, forced_len=forced_len, pad=pad, eos=eos, unk=unk)
    lp = lprobs.view(B, beam, V)
    if is_first_step(step):
        lp = lp[:, :1, :]
    else:  # in place: lprobs is this call's own buffer
        lp.add_(prev_scores.reshape(B, beam, 1).to(lp.dtype))
    flat = lp.reshape(B, -1)
    scores, flat_index = torch.topk(flat, k=min(2 * beam, flat.shape[1] - 1))
    tokens = flat_index.fmod(V)
    eos_mask = tokens.eq(eos) & scores.ne(NEG_INF)
    if ignore is not None:
        eos_mask[:, :beam] &= ~ignore
    return BeamCandidates(scores, tokens, torch.div(flat_index, V, rounding_mode="floor"), eos_mask)
