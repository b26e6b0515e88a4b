"""``conv_step`` on the Triton backend (kernel in :mod:`.triton_kernels`): gathers by beam index
and writes the new state to a second buffer; inference only."""

from __future__ import annotations

from ...dispatch import register
from ...triton_common.config import capability
from .api import conv_step_tensors
from .triton_kernels import conv_step_triton

CAPABILITY = capability("conv_step", backward=False)



def conv_step_triton_glue(x_t, state, weight, bias=None, beam_index=None, packed=None):
    """The Triton kernel reads ``weight`` itself; ``packed`` (the cpp kernel's layout) is not read."""
    return conv_step_triton(x_t, state, weight, bias, beam_index)


register("triton", "conv_step", conv_step_triton_glue, CAPABILITY, conv_step_tensors)
