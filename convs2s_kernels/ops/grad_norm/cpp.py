"""``grad_norm`` on the cpp backend (``csrc/grad_norm_cpu.cpp``): every tensor's elements one range
for the threads, each read once, squares summed in float over short blocks and in double across them."""

from __future__ import annotations

from typing import List

import torch

from ...dispatch import Capability, register
from ...extension import native
from .api import grad_norm_tensors


def _contiguous(tensors, **_) -> List[str]:
    return [] if all(t.is_contiguous() for t in tensors) else ["cpp grad_norm takes contiguous tensors"]


CAPABILITY = Capability(dtypes={"cpu": (torch.float32, torch.float64)}, extra=_contiguous)


def grad_norm_cpp(tensors) -> torch.Tensor:
    return native().grad_norm(list(tensors))


register("cpp", "grad_norm", grad_norm_cpp, CAPABILITY, grad_norm_tensors)
