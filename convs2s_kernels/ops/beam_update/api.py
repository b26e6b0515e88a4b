"""``beam_update``: the public function (checks its inputs, then calls the backend the dispatcher picks)."""

from __future__ import annotations

from typing import Optional, Tuple, Union

import torch

from ..._checks import check_shape, check_tensor
from ...dispatch import resolve
from ..beam_candidates.reference import BeamCandidates
from ..device_step import Step, check_step, is_device_step
from .reference import FinishedHypotheses

__all__ = ["beam_update", "beam_update_tensors"]


def beam_update_tensors(cands, step, tokens, scores, *args, **kwargs):
    """The floating tensors of a call, the running scores first (for the backends' capabilities)."""
    return scores, cands.scores


def _check_buffers(cands, step, tokens, scores, ignore, sent_ids, finished, attn) -> None:
    if not isinstance(cands, BeamCandidates):
        raise TypeError(f"cands must be a convs2s_kernels.BeamCandidates, got {type(cands).__name__}")
    if not isinstance(finished, FinishedHypotheses):
        raise TypeError(f"finished must be a convs2s_kernels.FinishedHypotheses, got {type(finished).__name__}")
    check_tensor("ignore", ignore, 2, floating=False)
    B, k = ignore.shape
    check_shape("cands.scores", cands.scores, (B, None), "(B, C)")
    if not k <= cands.scores.shape[1] <= 2 * k:
        raise ValueError(f"cands has {cands.scores.shape[1]} candidates per sentence; a beam of {k} takes "
                         f"{k} to {2 * k}")
    C = cands.scores.shape[1]
    for name in ("tokens", "beams", "eos_mask"):
        check_shape(f"cands.{name}", getattr(cands, name), (B, C), "(B, C), like cands.scores")
    check_tensor("tokens", tokens, 2, floating=False)
    check_shape("tokens", tokens, (B * k, None), "(B * beam, L + 2)")
    check_tensor("scores", scores, 2)
    check_shape("scores", scores, (B * k, None), "(B * beam, L + 1)")
    check_step(step, tokens.device)
    if is_device_step(step):
        # its value is not read: the buffers must hold every step (tokens L + 2, scores and finished L + 1)
        width = scores.shape[1]
        if (tokens.shape[1] != width + 1 or finished.tokens.shape[1] != width
                or (attn is not None and (attn.dim() != 3 or attn.shape[2] != width + 1))):
            raise ValueError(f"a tensor step needs whole buffers: tokens (N, L + 2), scores (N, L + 1), attn "
                             f"(N, S, L + 2), finished (., L + 1); got tokens {tuple(tokens.shape)}, scores "
                             f"{tuple(scores.shape)}, attn {None if attn is None else tuple(attn.shape)}, finished "
                             f"{tuple(finished.tokens.shape)}")
    elif tokens.shape[1] < step + 2 or scores.shape[1] < step + 1 or finished.tokens.shape[1] < step + 1:
        raise ValueError(f"step {step} does not fit the buffers (tokens {tuple(tokens.shape)}, "
                         f"scores {tuple(scores.shape)}, finished {tuple(finished.tokens.shape)})")
    check_tensor("sent_ids", sent_ids, 1, floating=False)
    check_shape("sent_ids", sent_ids, (B,), "(B,)")
    if finished.tokens.shape[0] != 2 * finished.count.shape[0] * k:
        raise ValueError(f"finished holds {finished.tokens.shape[0]} rows; beam {k} needs 2 x sentences x beam "
                         f"= {2 * finished.count.shape[0] * k}")
    rows = finished.tokens.shape[0]
    check_shape("finished.pos_scores", finished.pos_scores, tuple(finished.tokens.shape), "like finished.tokens")
    for name in ("scores", "lengths"):
        check_shape(f"finished.{name}", getattr(finished, name), (rows,), "(2 x sentences x beam,)")
    check_shape("finished.done", finished.done, tuple(finished.count.shape), "like finished.count")
    if (attn is None) != (finished.attn is None):
        raise ValueError("attn and finished.attn come together (both or neither)")


def beam_update(cands: BeamCandidates, step: Step, tokens: torch.Tensor, scores: torch.Tensor, ignore: torch.Tensor,
                sent_ids: torch.Tensor, finished: FinishedHypotheses, *, lenpen: float = 1.0,
                at_max_len: Union[bool, torch.Tensor] = False,
                attn: Optional[torch.Tensor] = None, eos: int = 2,
                backend: Optional[str] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    """Record the finished hypotheses among ``cands`` and advance every beam (in place on the
    search's buffers); returns ``(parents (N,), next ignore (B, beam))``. See
    :func:`convs2s_kernels.beam_update_ref` for the arguments; ``sent_ids`` name distinct sentences
    (the Triton backend updates each sentence's slots from its own program)."""
    _check_buffers(cands, step, tokens, scores, ignore, sent_ids, finished, attn)
    if is_device_step(step) and not (isinstance(at_max_len, torch.Tensor) and at_max_len.dtype == torch.bool
                                     and at_max_len.numel() == 1):
        raise ValueError("with a tensor step, at_max_len must be a one-element bool tensor (e.g. step == max_len): "
                         "a Python bool would be the recorded step's, not the replayed one's")
    args = (cands, step, tokens, scores, ignore, sent_ids, finished)
    kwargs = dict(lenpen=lenpen, at_max_len=at_max_len, attn=attn, eos=eos)
    fn = resolve("beam_update", tokens.device, backend, *args, **kwargs)
    return fn(*args, **kwargs)
