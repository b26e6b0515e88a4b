"""``beam_candidates``: the public function (checks its inputs, then calls the backend the dispatcher picks)."""

from __future__ import annotations

from typing import Optional

import torch

from ..._checks import check_shape, check_tensor
from ...dispatch import resolve
from ..device_step import Step, check_step, is_first_step
from .reference import BeamCandidates

__all__ = ["BeamCandidates", "beam_candidates", "beam_candidates_tensors"]


def beam_candidates_tensors(logits, prev_scores=None, **kwargs):
    """The floating tensors of a call, the activation first (for the backends' capabilities)."""
    return logits, prev_scores


def _check_options(V: int, beam: int, step, max_len: int, min_len: int, specials: dict, device) -> None:
    check_step(step, device)
    for name, value in (("max_len", max_len), ("min_len", min_len)):
        if not isinstance(value, int) or value < 0:
            raise ValueError(f"{name} must be a non-negative int, got {value!r}")
    if not isinstance(beam, int) or beam < 1:
        raise ValueError(f"beam must be a positive int, got {beam!r}")
    for name, token in specials.items():
        if not 0 <= token < V:
            raise ValueError(f"{name} = {token} is not a token of the {V}-word vocabulary")
    if (1 if is_first_step(step) else beam) * V - 1 < 1:
        raise ValueError(f"a {V}-word vocabulary leaves no candidate at beam {beam}")


def _check_row_tensor(name: str, t: Optional[torch.Tensor], N: int, device: torch.device, floating: bool) -> None:
    if t is None:
        return
    check_tensor(name, t, 1, floating=floating)
    check_shape(name, t, (N,), "(N,)")
    if t.device != device:
        raise ValueError(f"{name} is on {t.device} but logits is on {device}")


def beam_candidates(logits: torch.Tensor, prev_scores: Optional[torch.Tensor], *, beam: int, step: Step,
                    max_len: int, min_len: int = 1, unkpen: float = 0.0, forced_len: Optional[torch.Tensor] = None,
                    ignore: Optional[torch.Tensor] = None, pad: int = 1, eos: int = 2, unk: int = 3,
                    backend: Optional[str] = None) -> BeamCandidates:
    """One beam-search step: ``log_softmax(logits)`` under the search's rules (NaN is -inf, no PAD,
    UNK minus ``unkpen``, only EOS at ``max_len`` or at a row's ``forced_len``, no EOS before
    ``min_len`` or before it), plus each row's running score ``prev_scores``, and every sentence's
    ``C = 2 * beam`` best continuations over its beams, best first.

    ``logits (N, V)`` with ``N = B * beam`` rows (a sentence's beams adjacent), ``step`` an int or
    a (1,) int64 tensor on their device (a step counted by the device, for a recorded search step:
    never 0), ``prev_scores (N,)`` (None or ignored at step 0, where only a sentence's first beam
    is live), ``forced_len (N,)`` int64, ``ignore (B, beam)`` bool (fairseq's ``cands_to_ignore``) ->
    :class:`BeamCandidates` ``(scores, tokens, beams, eos_mask)``, each ``(B, C)``. Equal scores
    rank in no guaranteed order (the cpp and Triton backends: the lower beam, then the lower token).
    cpp's scores are the reference's bit for bit (ATen's log-softmax); Triton sums the exponentials
    in its own order, so its scores agree within fp32 rounding of that sum (about 1e-5 relative
    over a 40k vocabulary, nearer the exact value than the reference's own) and candidates whose
    scores differ by less may rank the other way. See :func:`convs2s_kernels.beam_candidates_ref`.
    """
    check_tensor("logits", logits, 2)
    N, V = logits.shape
    _check_options(V, beam, step, max_len, min_len, dict(pad=pad, eos=eos, unk=unk), logits.device)
    if N % beam:
        raise ValueError(f"logits has {N} rows, not a whole number of sentences x beam {beam}")
    first = is_first_step(step)
    if not first and prev_scores is None:
        raise ValueError("prev_scores (N,) is needed after step 0")
    _check_row_tensor("prev_scores", None if first else prev_scores, N, logits.device, True)
    _check_row_tensor("forced_len", forced_len, N, logits.device, False)
    if forced_len is not None and forced_len.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"forced_len must be int32 or int64, got {forced_len.dtype}")
    if ignore is not None:
        check_tensor("ignore", ignore, 2, floating=False)
        check_shape("ignore", ignore, (N // beam, beam), "(B, beam)")
        if ignore.dtype != torch.bool:
            raise TypeError(f"ignore must be a bool tensor, got {ignore.dtype}")
    kwargs = dict(beam=beam, step=step, max_len=max_len, min_len=min_len, unkpen=unkpen, forced_len=forced_len,
                  ignore=ignore, pad=pad, eos=eos, unk=unk)
    fn = resolve("beam_candidates", logits.device, backend, logits, prev_scores, **kwargs)
    return fn(logits, prev_scores, **kwargs)
