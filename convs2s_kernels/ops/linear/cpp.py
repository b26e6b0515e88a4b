"""``linear`` on the cpp backend (``csrc/small_gemm.cpp``): 1-8 rows of fp32 or bf16 against a
large weight, streamed once by an AVX-512 / AVX2 / baseline kernel picked at run time. More rows
go to a GEMM (the reference: ATen's MKL/oneDNN). Inference only."""

from __future__ import annotations

import torch

from ...dispatch import Capability, register
from ...extension import native
from .api import linear_tensors

MAX_ROWS = 8  # the few-row kernel's register tile (csrc/small_gemm.h kSmallGemmMaxRows)
CAPABILITY = Capability(dtypes={"cpu": (torch.float32, torch.bfloat16)}, rows=(1, MAX_ROWS), backward=False)


def linear_cpp(x, weight, bias=None):
    return native().small_linear(x, weight, bias)


register("cpp", "linear", linear_cpp, CAPABILITY, linear_tensors)
