"""``linear_w8a8`` on the cpp backend (``csrc/linear_w8a8_cpu.cpp``; kernels per
instruction set in ``linear_w8a8_avx512.cpp`` and ``linear_w8a8_avx2.cpp``): AMX-INT8 tiles (on a packed
weight), AVX-512 VNNI, AVX2 or plain integer dot products (``convs2s_kernels.extension.int8_kernel_isa()``
says which); inference only."""

from __future__ import annotations

from ...dispatch import register
from ...extension import native
from ..linear_int8.api import linear_int8_tensors
from ..linear_int8.cpp import CAPABILITY


def linear_w8a8_cpp(x, qweight, scale, bias=None, packed=None, activation_bits=8, weight_bits=8):
    lead = x.shape[:-1]
    y = native().linear_w8a8(x.reshape(-1, x.shape[-1]), qweight, scale, bias, packed, activation_bits, weight_bits)
    return y.view(*lead, qweight.shape[0])


register("cpp", "linear_w8a8", linear_w8a8_cpp, CAPABILITY, linear_int8_tensors)
