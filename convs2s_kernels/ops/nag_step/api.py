"""``nag_step``: the public function (checks its inputs, calls the backend the dispatcher picks)."""

from __future__ import annotations

from typing import Optional, Sequence

import torch

from ...dispatch import resolve

__all__ = ["nag_step", "nag_step_tensors"]


def nag_step_tensors(params, grads=None, momentum_buffers=None, **_):
    """The floating tensors of a call (for the backends' capabilities): the first parameter decides."""
    return (params[0],)


def _check(params, grads, momentum_buffers) -> None:
    if not (len(params) == len(grads) == len(momentum_buffers)):
        raise ValueError(f"nag_step: {len(params)} params, {len(grads)} grads and {len(momentum_buffers)} "
                         "momentum buffers; give one of each per parameter (a grad may be None)")
    for i, (p, g, b) in enumerate(zip(params, grads, momentum_buffers)):
        for name, t in (("grad", g), ("momentum buffer", b)):
            if t is None and name == "grad":
                continue
            if not isinstance(t, torch.Tensor) or t.shape != p.shape or t.dtype != p.dtype or t.device != p.device:
                got = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
                raise ValueError(f"nag_step: the {name} of parameter {i} must match it ({tuple(p.shape)}, {p.dtype}, "
                                 f"{p.device}), got {got}")
        if b.numel() and (b.data_ptr() == p.data_ptr() or (g is not None and g.data_ptr() == b.data_ptr())):
            raise ValueError(f"nag_step: the momentum buffer of parameter {i} shares memory with its parameter or "
                             "grad; give it a buffer of its own")
        if not p.dtype.is_floating_point or p.dtype != params[0].dtype or p.device != params[0].device:
            raise ValueError(f"nag_step: parameter {i} is {p.dtype} on {p.device}; all must share the first's "
                             f"floating dtype and device ({params[0].dtype}, {params[0].device})")


@torch.no_grad()
def nag_step(params: Sequence[torch.Tensor], grads: Sequence[Optional[torch.Tensor]],
              momentum_buffers: Sequence[torch.Tensor], *, lr: float, momentum: float, weight_decay: float = 0.0,
              grad_scale: float = 1.0, backend: Optional[str] = None) -> None:
    """One NAG update of every parameter, in place (``params`` and ``momentum_buffers``)::

        g = grad * grad_scale + weight_decay * p     (a None grad counts as zero)
        buf = momentum * buf + g
        p = p - lr * (g + momentum * buf)

    which is ``torch.optim.SGD(lr, momentum, nesterov=True, weight_decay)`` (dampening 0) on the
    gradients times ``grad_scale``; a new buffer of zeros gives SGD's first step (buf = g).
    Each list holds one tensor per parameter, of the parameter's shape, dtype and device."""
    params, grads, momentum_buffers = list(params), list(grads), list(momentum_buffers)
    _check(params, grads, momentum_buffers)
    if not params:
        return
    fn = resolve("nag_step", params[0].device, backend, params, grads, momentum_buffers)
    fn(params, grads, momentum_buffers, lr=float(lr), momentum=float(momentum), weight_decay=float(weight_decay),
       grad_scale=float(grad_scale))
