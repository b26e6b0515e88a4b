"""``conv_step`` on the Triton backend (kernel in :mod:`.triton_kernels`): gathers by beam index
and writes the new state to a second buffer; inference only."""

from __future__ import annotations

from ...dispatch import register
from ...triton_common.config import capability
from .api import conv_step_tensors
from .triton_kernels import conv_step_triton

CAPABILITY = capability("conv_step", backward=False)

register("triton", "conv_step", conv_step_triton, CAPABILITY, conv_step_tensors)
