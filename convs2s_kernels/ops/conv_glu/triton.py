"""``conv_glu`` on the Triton backend (kernels in :mod:`.triton_kernels`): CUDA tensors, or CPU
tensors under the interpreter; forward and backward."""

from __future__ import annotations

from ...dispatch import register
from ...triton_common.config import capability
from .api import conv_glu_tensors
from .triton_kernels import conv_glu_triton

CAPABILITY = capability("conv_glu", backward=True)


def conv_glu_triton_op(x, weight, bias=None, *, packed=None, **kwargs):
    """``conv_glu_triton``; ``packed`` (the cpp kernel's copy of the weight) is ignored."""
    return conv_glu_triton(x, weight, bias, **kwargs)


register("triton", "conv_glu", conv_glu_triton_op, CAPABILITY, conv_glu_tensors)
