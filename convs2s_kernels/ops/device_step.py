"""A search step counted on the device: the step index as a (1,) int64 tensor instead of a Python
int, so that a recorded search step (a CUDA graph) replays with the step it is at, not the one it
was recorded at. The search ops take either; these helpers read and write the column a tensor
step names without reading it on the host."""

from __future__ import annotations

from typing import Union

import torch

Step = Union[int, torch.Tensor]


def is_device_step(step) -> bool:
    return isinstance(step, torch.Tensor)


def is_first_step(step) -> bool:
    """Step 0 (only a sentence's first beam live); a tensor step never is."""
    return not is_device_step(step) and step == 0


def written(t: torch.Tensor, step: Step, past: int) -> torch.Tensor:
    """The columns of ``t`` a search has written by ``step``: ``t[..., :step + past]``; all of them
    for a tensor step (its value is not read; past it the search's rows are all alike)."""
    return t if is_device_step(step) else t[..., : step + past]


def check_step(step, device: torch.device) -> None:
    """A non-negative int, or a (1,) int64 tensor on ``device`` (never 0: its value is not read,
    and the first step's rule, only a sentence's first beam live, needs to know it is the first)."""
    if is_device_step(step):
        if step.shape != (1,) or step.dtype != torch.int64 or step.device != device:
            raise ValueError(f"a tensor step must be a (1,) int64 tensor on {device}, got {step.dtype} "
                             f"{tuple(step.shape)} on {step.device}")
    elif not isinstance(step, int) or step < 0:
        raise ValueError(f"step must be a non-negative int or a (1,) int64 tensor, got {step!r}")


def column(t: torch.Tensor, col: torch.Tensor) -> torch.Tensor:
    """``t[..., col]`` for a (1,) index tensor: ``(R, W) -> (R,)``, ``(R, S, W) -> (R, S)``."""
    return t.index_select(-1, col).squeeze(-1)


def put_column(t: torch.Tensor, col: Step, values: torch.Tensor) -> None:
    """``t[..., col] = values`` in place, ``col`` an int or a (1,) index tensor."""
    if is_device_step(col):
        t.index_copy_(t.dim() - 1, col, values.unsqueeze(-1).to(t.dtype))
    else:
        t[..., col] = values
