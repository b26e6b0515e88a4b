"""``nag_step_ref``: the plain-PyTorch ground truth of ``nag_step``: torch.optim.SGD's Nesterov
update written out tensor by tensor (also the ``reference`` backend, on any device)."""

from __future__ import annotations

import torch


@torch.no_grad()
def nag_step_ref(params, grads, momentum_buffers, *, lr: float, momentum: float, weight_decay: float = 0.0,
                 grad_scale: float = 1.0) -> None:
    for p, grad, buf in zip(params, grads, momentum_buffers):
        g = torch.zeros_like(p) if grad is None else grad * grad_scale
        if weight_decay:
            g = g.add(p, alpha=weight_decay)
        buf.mul_(momentum).add_(g)
        p.add_(g.add(buf, alpha=momentum), alpha=-lr)
