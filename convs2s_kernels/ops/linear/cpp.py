"""``linear`` on the cpp backend (``csrc/small_gemm.cpp``): fp32 or bf16 rows against a large
weight. At the row counts where the few-row kernel was measured faster than ATen's GEMM for this
weight shape (:mod:`convs2s_kernels.tune`) it streams the weight once, from registers; at the
others the extension calls the GEMM the reference calls. Inference only."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ...dispatch import Capability, register
from ...extension import native
from .api import linear_tensors

CAPABILITY = Capability(dtypes={"cpu": (torch.float32, torch.bfloat16)}, backward=False)


def linear_cpp(x, weight, bias=None):
    rows = x.reshape(-1, x.shape[-1])
    if rows.shape[0] == 0:
        return F.linear(x, weight, bias)
    return native().small_linear(rows, weight, bias).view(*x.shape[:-1], weight.shape[0])


register("cpp", "linear", linear_cpp, CAPABILITY, linear_tensors)
