"""``beam_update`` on the cpp backend (``csrc/beam_update_cpu.cpp``): each sentence's candidates
walked once for the finished hypotheses and the next beam, then one gather per buffer; replaces
~30 small tensor ops per step."""

from __future__ import annotations

from typing import List

import torch

from ...dispatch import Capability, register
from ...extension import native
from ..device_step import is_device_step
from .api import beam_update_tensors


def _layouts(cands, step, tokens, scores, ignore, sent_ids, finished, **kwargs) -> List[str]:
    want = [("cands.scores", cands.scores, torch.float32), ("scores", scores, torch.float32),
            ("finished.scores", finished.scores, torch.float32), ("tokens", tokens, torch.int64)]
    why = [f"cpp beam_update takes {dtype} {name}, got {t.dtype}" for name, t, dtype in want if t.dtype != dtype]
    return why + (["cpp beam_update takes an int step, not a tensor"] if is_device_step(step) else [])


CAPABILITY = Capability(dtypes={"cpu": (torch.float32,)}, backward=False, extra=_layouts)


def beam_update_cpp(cands, step, tokens, scores, ignore, sent_ids, finished, *, lenpen=1.0, at_max_len=False,
                    attn=None, eos=2):
    parents, new_ignore = native().beam_update(
        cands.scores, cands.tokens, cands.beams, cands.eos_mask, step, tokens, scores, attn, ignore, sent_ids,
        finished.tokens, finished.pos_scores, finished.scores, finished.lengths, finished.attn, finished.count,
        finished.done, float(lenpen), bool(at_max_len), eos)
    return parents, new_ignore


register("cpp", "beam_update", beam_update_cpp, CAPABILITY, beam_update_tensors)
