"""``output_loss`` on the cpp backend (``csrc/output_loss_cpu.cpp``): the logits of a block of rows
made, reduced and turned into their gradient while the block is in cache (``BLOCK_ROWS`` rows x V
floats, a few MB: in L3), then multiplied into the input's and the weight's gradients; the whole
``(N, V)`` logits never exist, nor their log-softmax or its gradient (each N x V x 4 bytes, 45 MB
at 2,000 tokens and 5.5K words, written and read several times by the plain composition). The
loss being the end of the graph, the gradients are made with it and scaled by the incoming
gradient in backward. Every product is ATen's GEMM. In bfloat16 (bf16 autocast) the products run
in bf16, as autocast's ``F.linear`` would, and the block's passes in float32; the loss is float32."""

from __future__ import annotations

import torch

from ...dispatch import Capability, register
from ...extension import native
from .api import output_loss_tensors

CAPABILITY = Capability(dtypes={"cpu": (torch.float32, torch.float64, torch.bfloat16)}, backward=True)
BLOCK_ROWS = 512  # 512 x 5.5K words x 4 bytes = 11 MB: in L3 (bench/results/amd-zen3-2c/training-ops.md)
# float32 rows are padded to a multiple of this (zero rows, ignored targets): MKL's GEMM runs the
# logits' product slower at other row counts (bench/results/amd-zen3-2c/training-ops.md, "Block rows")
ALIGN_ROWS = 8


def _aligned(x, target, ignore_index):
    """``x`` and ``target`` with zero rows of ignored targets appended up to a multiple of ALIGN_ROWS."""
    pad = (-x.shape[0]) % ALIGN_ROWS
    if pad == 0 or x.dtype != torch.float32:
        return x, target
    return (torch.cat([x, x.new_zeros(pad, x.shape[1])]),
            torch.cat([target, target.new_full((pad,), ignore_index)]))


class _OutputLoss(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, target, eps, ignore_index):
        xa, ta = _aligned(x, target, ignore_index)
        loss, nll, dx, dw, db = native().output_loss_forward(xa, weight, bias, ta, eps, ignore_index, True,
                                                             BLOCK_ROWS)
        ctx.save_for_backward(dx[:x.shape[0]], dw, db if bias is not None else None)
        nll = nll.to(_loss_dtype(x))
        ctx.mark_non_differentiable(nll)
        return loss.to(_loss_dtype(x)), nll

    @staticmethod
    def backward(ctx, g, _g_nll):
        dx, dw, db = ctx.saved_tensors
        return dx * g, dw * g, None if db is None else db * g, None, None, None


def _loss_dtype(x):
    """float64 for float64 inputs, else float32 (the reference's log-softmax is float32 under bf16)."""
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def output_loss_cpp(x, weight, bias, target, *, label_smoothing=0.0, ignore_index=1):
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (x, weight, bias)):
        return _OutputLoss.apply(x, weight, bias, target, label_smoothing, ignore_index)
    xa, ta = _aligned(x, target, ignore_index)
    loss, nll = native().output_loss_forward(xa, weight, bias, ta, label_smoothing, ignore_index, False, BLOCK_ROWS)
    return loss.to(_loss_dtype(x)), nll.to(_loss_dtype(x))


register("cpp", "output_loss", output_loss_cpp, CAPABILITY, output_loss_tensors)
