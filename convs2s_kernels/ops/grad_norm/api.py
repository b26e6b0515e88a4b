"""``grad_norm``: the public function (checks its inputs, calls the backend the dispatcher picks)."""

from __future__ import annotations

from typing import Optional, Sequence

import torch

from ...dispatch import resolve

__all__ = ["grad_norm", "grad_norm_tensors"]


def grad_norm_tensors(tensors, **_):
    """The floating tensors of a call (for the backends' capabilities): the first decides."""
    return (tensors[0],)


@torch.no_grad()
def grad_norm(tensors: Sequence[Optional[torch.Tensor]], *, backend: Optional[str] = None) -> torch.Tensor:
    """``sqrt(sum of t**2 over every element of every tensor)`` as a 0-dim float64 tensor on the
    tensors' device (None entries are skipped, an empty list gives 0): the norm
    ``torch.nn.utils.clip_grad_norm_`` clips by. Inf or NaN anywhere gives a non-finite norm.
    The tensors share one floating dtype and device."""
    present = [t for t in tensors if t is not None]
    if not present:
        return torch.zeros((), dtype=torch.float64)
    first = present[0]
    for i, t in enumerate(present):
        if not isinstance(t, torch.Tensor) or not t.dtype.is_floating_point or t.dtype != first.dtype \
                or t.device != first.device:
            got = f"{t.dtype} on {t.device}" if isinstance(t, torch.Tensor) else type(t).__name__
            raise ValueError(f"grad_norm: tensor {i} is {got}; all must share the first's floating dtype and device "
                             f"({first.dtype}, {first.device})")
    fn = resolve("grad_norm", first.device, backend, present)
    return fn(present)
