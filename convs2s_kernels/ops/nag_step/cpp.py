"""``nag_step`` on the cpp backend (``csrc/nag_step_cpu.cpp``): every tensor's elements one range
for the threads, each element read and written once."""

from __future__ import annotations

from typing import List

import torch
from torch.autograd.graph import increment_version

from ...dispatch import Capability, register
from ...extension import native
from .api import nag_step_tensors


def _contiguous(params, grads, momentum_buffers, **_) -> List[str]:
    tensors = [*params, *(g for g in grads if g is not None), *momentum_buffers]
    return [] if all(t.is_contiguous() for t in tensors) else ["cpp nag_step takes contiguous tensors"]


CAPABILITY = Capability(dtypes={"cpu": (torch.float32, torch.float64)}, extra=_contiguous)


def nag_step_cpp(params, grads, momentum_buffers, *, lr, momentum, weight_decay=0.0, grad_scale=1.0) -> None:
    native().nag_step(params, grads, momentum_buffers, lr, momentum, weight_decay, grad_scale)
    # written through raw pointers: move the version counters on as an in-place op would, so
    # whatever caches a copy keyed on them (a layer's weight-normed weight) sees the change
    increment_version(params)
    increment_version(momentum_buffers)


register("cpp", "nag_step", nag_step_cpp, CAPABILITY, nag_step_tensors)
