"""``linear_int8`` on the cpp backend (``csrc/linear_int8_cpu.cpp``, on ``csrc/small_gemm.cpp``): int8 weight rows widened in
registers, float32 activations and sums; inference only."""

from __future__ import annotations

from typing import List

import torch

from ...dispatch import Capability, register
from ...extension import native
from .api import linear_int8_tensors


def _float32_scale_and_bias(x, qweight, scale, bias=None, packed=None, activation_bits=8, weight_bits=8) -> List[str]:
    if scale.dtype != torch.float32 or (bias is not None and bias.dtype != torch.float32):
        return [f"cpp linear_int8 takes float32 scale and bias, got scale {scale.dtype}"
                + ("" if bias is None else f", bias {bias.dtype}")]
    return []


CAPABILITY = Capability(dtypes={"cpu": (torch.float32,)}, backward=False, extra=_float32_scale_and_bias)


def linear_int8_cpp(x, qweight, scale, bias=None):
    lead = x.shape[:-1]
    y = native().linear_int8(x.reshape(-1, x.shape[-1]), qweight, scale, bias)
    return y.view(*lead, qweight.shape[0])


register("cpp", "linear_int8", linear_int8_cpp, CAPABILITY, linear_int8_tensors)
