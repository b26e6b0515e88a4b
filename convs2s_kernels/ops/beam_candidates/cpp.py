"""``beam_candidates`` on the cpp backend (``csrc/beam_candidates_cpu.cpp``): ATen's log-softmax,
then one pass per row that keeps its best ``2 * beam`` entries under the search's rules, rows in
parallel, and a merge per sentence; replaces a dozen passes over ``(N, V)`` and ``torch.topk``."""

from __future__ import annotations

import torch

from ...dispatch import Capability, register
from ...extension import native
from ..device_step import is_device_step
from .api import beam_candidates_tensors
from .reference import BeamCandidates


def _int_step(logits, prev_scores=None, *, step, **kwargs):
    return ["cpp beam_candidates takes an int step, not a tensor"] if is_device_step(step) else []


CAPABILITY = Capability(dtypes={"cpu": (torch.float32, torch.bfloat16)}, backward=False, extra=_int_step)


def beam_candidates_cpp(logits, prev_scores, *, beam, step, max_len, min_len=1, unkpen=0.0, forced_len=None,
                        ignore=None, pad=1, eos=2, unk=3):
    out = native().beam_candidates(logits, prev_scores if step > 0 else None, beam, step, max_len, min_len,
                                   float(unkpen), forced_len, ignore, pad, eos, unk)
    return BeamCandidates(*out)


register("cpp", "beam_candidates", beam_candidates_cpp, CAPABILITY, beam_candidates_tensors)
