"""``conv_step`` on the cpp backend (``csrc/conv_step_cpu.cpp``): gather by parent row, shift,
append and the conv + GLU step in one pass; fp32/bf16 rows run a few-row kernel that streams the
weight once at the row counts where it was measured faster than ATen's GEMM for that weight
(``convs2s_kernels.tune``), the GEMM at the others. Inference only."""

from __future__ import annotations

from ...dispatch import Capability, register
from ...extension import CPP_DTYPES, native
from .api import conv_step_tensors

CAPABILITY = Capability(dtypes={"cpu": CPP_DTYPES}, backward=False)


def conv_step_cpp(x_t, state, weight, bias=None, beam_index=None):
    out, new_state = native().conv_step_forward(x_t, state, weight.contiguous(), bias, beam_index)
    return out, new_state


register("cpp", "conv_step", conv_step_cpp, CAPABILITY, conv_step_tensors)
