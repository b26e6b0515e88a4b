"""``linear`` on the cpp backend (``csrc/linear_cpu.cpp``, on ``csrc/small_gemm.cpp``): fp32 or bf16 rows against a large
weight. At the row counts where the few-row kernel was measured faster than the GEMM for this
weight shape (:mod:`convs2s_kernels.tune`) it streams the weight once, from registers; at the
others the extension calls the GEMM the reference calls, or oneDNN's where that was measured
faster (``csrc/library_gemm.cpp``). A weight that is the transposed view of a (K, N) matrix is
multiplied as that matrix (no copy). Inference only."""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from ...dispatch import Capability, register
from ...extension import native, unavailable_reason
from .._packing import packed_from
from .api import linear_tensors

CAPABILITY = Capability(dtypes={"cpu": (torch.float32, torch.bfloat16)}, backward=False)
PACKED_DTYPES = (torch.float32, torch.bfloat16)


def linear_cpp(x, weight, bias=None, packed=None):
    rows = x.reshape(-1, x.shape[-1])
    if rows.shape[0] == 0:
        return F.linear(x, weight, bias)
    return native().small_linear(rows, weight, bias, packed).view(*x.shape[:-1], weight.shape[0])


def pack_linear_weight(weight: torch.Tensor) -> Optional[torch.Tensor]:
    """An ``(N, K)`` Linear weight laid out once for the cpp ``linear``'s decoding-step kernel on
    this CPU: ``weight.T`` in the conv step's packed layout (:func:`convs2s_kernels.pack_conv_step_weight`:
    blocks of output columns, each one contiguous run, on huge pages). ``None`` where the cpp kernels
    cannot take it (no extension, not a CPU tensor, not float32/bf16)."""
    if unavailable_reason() is not None or weight.device.type != "cpu" or weight.dtype not in PACKED_DTYPES:
        return None
    if weight.dim() != 2:
        raise ValueError(f"pack_linear_weight takes an (N, K) weight, got {tuple(weight.shape)}")
    with torch.no_grad():
        return packed_from(native().pack_kn_weight(weight.detach().t()), weight)


register("cpp", "linear", linear_cpp, CAPABILITY, linear_tensors)
