"""``conv_glu`` on the Triton backend (kernels in :mod:`.triton_kernels`): CUDA tensors, or CPU
tensors under the interpreter; forward and backward."""

from __future__ import annotations

from ...dispatch import register
from ...triton_common.config import capability
from .api import conv_glu_tensors
from .triton_kernels import conv_glu_triton

CAPABILITY = capability("conv_glu", backward=True)

register("triton", "conv_glu", conv_glu_triton, CAPABILITY, conv_glu_tensors)
