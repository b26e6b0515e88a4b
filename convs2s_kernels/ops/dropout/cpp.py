"""``dropout`` on the cpp backend (``csrc/dropout_cpu.cpp``): the mask hashed from the seed and the
element index in parallel, applied with the scale in the same pass; backward applies the same
mask to the gradient, remade from the seed (nothing saved)."""

from __future__ import annotations

import torch

from ...dispatch import Capability, register
from ...extension import CPP_DTYPES, native
from .api import dropout_tensors

CAPABILITY = Capability(dtypes={"cpu": CPP_DTYPES}, backward=True)


class _Dropout(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, p, seed):
        ctx.p, ctx.seed = p, seed
        return native().dropout_apply(x, p, seed)

    @staticmethod
    def backward(ctx, grad):
        return native().dropout_apply(grad.contiguous(), ctx.p, ctx.seed), None, None


def dropout_cpp(x, *, p, seed):
    return _Dropout.apply(x, p, seed)


register("cpp", "dropout", dropout_cpp, CAPABILITY, dropout_tensors)
