"""``output_loss_ref``: the plain-PyTorch ground truth: the whole ``(N, V)`` logits, log-softmax,
the smoothed loss (also the ``reference`` backend)."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def output_loss_ref(x, weight, bias, target, *, label_smoothing: float = 0.0, ignore_index: int = 1):
    logits = F.linear(x, weight, bias)
    lprobs = F.log_softmax(logits if logits.dtype == torch.float64 else logits.float(), dim=-1)
    nll = F.nll_loss(lprobs, target, ignore_index=ignore_index, reduction="sum")
    eps = label_smoothing
    if eps <= 0:
        return nll, nll.detach()
    eps_i = eps / (lprobs.shape[-1] - 1)
    smooth = -(lprobs.sum(dim=-1) * target.ne(ignore_index)).sum()
    return (1.0 - eps - eps_i) * nll + eps_i * smooth, nll.detach()
