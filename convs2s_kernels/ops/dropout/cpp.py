"""``dropout`` on the cpp backend (``csrc/dropout_cpu.cpp``): the mask hashed from the seed and the
element index in parallel, applied with the scale in the same pass; backward applies the same
mask to the gradient, remade from the seed (nothing saved but the seed).

Eager calls take a plain ``autograd.Function`` (an int seed); under ``torch.compile`` the kernel is
the ``torch.library`` custom op ``convs2s::dropout_cpu``, traced as one node, with the seed a
one-element int64 tensor (drawn inside the graph when not given: ``api.draw_seed_tensor``), read
only where the kernel runs."""

from __future__ import annotations

import torch
from torch import Tensor

from ...dispatch import Capability, register
from ...extension import CPP_DTYPES, native
from .api import dropout_tensors

CAPABILITY = Capability(dtypes={"cpu": CPP_DTYPES}, backward=True)


@torch.library.custom_op("convs2s::dropout_cpu", mutates_args=())
def _dropout_op(x: Tensor, p: float, seed: Tensor) -> Tensor:
    return native().dropout_apply(x, p, int(seed))


@_dropout_op.register_fake
def _(x, p, seed):
    return torch.empty_like(x, memory_format=torch.contiguous_format)


def _dropout_setup(ctx, inputs, output):
    _x, ctx.p, seed = inputs
    ctx.save_for_backward(seed)


def _dropout_backward(ctx, grad):
    (seed,) = ctx.saved_tensors
    return _dropout_op(grad.contiguous(), ctx.p, seed), None, None  # the op itself: twice differentiable


_dropout_op.register_autograd(_dropout_backward, setup_context=_dropout_setup)


class _Dropout(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, p, seed):
        ctx.p, ctx.seed = p, seed
        return native().dropout_apply(x, p, seed)

    @staticmethod
    def backward(ctx, grad):
        return native().dropout_apply(grad.contiguous(), ctx.p, ctx.seed), None, None


def dropout_cpp(x, *, p, seed):
    if torch.compiler.is_compiling():  # the custom op: traced as one node, the seed a tensor
        if not isinstance(seed, torch.Tensor):
            seed = torch.full((1,), seed, dtype=torch.int64)
        return _dropout_op(x.contiguous(), float(p), seed)
    return _Dropout.apply(x, p, seed)


register("cpp", "dropout", dropout_cpp, CAPABILITY, dropout_tensors)
