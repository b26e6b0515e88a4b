"""``grad_norm_ref``: the plain-PyTorch ground truth of ``grad_norm``: the norm of the per-tensor
norms, as ``torch.nn.utils.clip_grad_norm_`` computes it (also the ``reference`` backend, on any
device), returned in float64."""

from __future__ import annotations

import torch


@torch.no_grad()
def grad_norm_ref(tensors) -> torch.Tensor:
    present = [t for t in tensors if t is not None]
    if not present:
        return torch.zeros((), dtype=torch.float64)
    return torch.linalg.vector_norm(torch.stack(torch._foreach_norm(present))).double()
