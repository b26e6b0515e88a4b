"""``beam_update`` on the Triton backend (kernel in :mod:`.triton_kernels`): one launch a step,
no host read; the step may be a device tensor (a recorded search step)."""

from __future__ import annotations

import dataclasses
from typing import List

import torch

from ...dispatch import register
from ...triton_common.config import capability
from .api import beam_update_tensors
from .triton_kernels import beam_update_triton

MAX_BEAM = 16  # a sentence's 2 * beam candidates ranked in one tile


def _layouts(cands, step, tokens, scores, ignore, sent_ids, finished, attn=None, **kwargs) -> List[str]:
    why = [f"triton beam_update takes a beam up to {MAX_BEAM}, got {ignore.shape[1]}"] \
        if ignore.shape[1] > MAX_BEAM else []
    want = [("cands.scores", cands.scores, torch.float32), ("scores", scores, torch.float32),
            ("finished.scores", finished.scores, torch.float32), ("finished.pos_scores", finished.pos_scores,
                                                                   torch.float32),
            ("tokens", tokens, torch.int64), ("finished.tokens", finished.tokens, torch.int64)]
    why += [f"triton beam_update takes {dtype} {name}, got {t.dtype}" for name, t, dtype in want if t.dtype != dtype]
    if attn is not None and finished.attn is not None and attn.dtype != finished.attn.dtype:
        why.append(f"triton beam_update takes attn and finished.attn of one dtype, got {attn.dtype} and "
                   f"{finished.attn.dtype}")
    return why


CAPABILITY = dataclasses.replace(capability("beam_update", backward=False), extra=_layouts)

register("triton", "beam_update", beam_update_triton, CAPABILITY, beam_update_tensors)
