"""``conv_step`` on the cpp backend (``csrc/conv_step_cpu.cpp``): gather by parent row, shift,
append and the conv + GLU step in one pass; fp32/bf16 rows run a few-row kernel that streams the
weight once at the row counts where it was measured faster than the GEMM for that weight
(``convs2s_kernels.tune``), the GEMM at the others (ATen's or oneDNN's, whichever was measured
faster: ``csrc/library_gemm.cpp``). Inference only."""

from __future__ import annotations

from typing import Optional

import torch

from ...dispatch import Capability, register
from ...extension import CPP_DTYPES, native, unavailable_reason
from .._packing import packed_from
from .api import conv_step_tensors

CAPABILITY = Capability(dtypes={"cpu": CPP_DTYPES}, backward=False)
PACKED_DTYPES = (torch.float32, torch.bfloat16)


def conv_step_cpp(x_t, state, weight, bias=None, beam_index=None, packed=None):
    out, new_state = native().conv_step_forward(x_t, state, weight.contiguous(), bias, beam_index, packed)
    return out, new_state


def pack_conv_step_weight(weight: torch.Tensor) -> Optional[torch.Tensor]:
    """A conv weight ``(k, C_in, 2C)`` laid out once for the cpp conv step on this CPU: its
    linearised ``(k C_in, 2C)`` matrix cut into blocks of columns (64 with AVX-512 kernels, 16
    otherwise), each block one contiguous ``(k C_in, width)`` run, zero-padded, on 2 MB huge pages
    where the OS grants them; a step then reads each thread's share of the weight as one stream
    (``csrc/small_gemm.cpp``, ``small_gemm_kn_packed``). ``None`` where the cpp kernels cannot
    take it (no extension, not a CPU tensor, not float32/bf16). Pack again after the weight
    changes, and in the process that uses it (the layout follows the CPU's instruction set)."""
    if unavailable_reason() is not None or weight.device.type != "cpu" or weight.dtype not in PACKED_DTYPES:
        return None
    if weight.dim() != 3:
        raise ValueError(f"pack_conv_step_weight takes a (k, C_in, 2C) conv weight, got {tuple(weight.shape)}")
    with torch.no_grad():
        return packed_from(native().pack_kn_weight(weight.detach().reshape(-1, weight.shape[2])), weight)


register("cpp", "conv_step", conv_step_cpp, CAPABILITY, conv_step_tensors)
