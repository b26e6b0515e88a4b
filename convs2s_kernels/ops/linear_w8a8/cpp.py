"""``linear_w8a8`` on the cpp backend (``csrc/linear_w8a8_cpu.cpp``): AMX-INT8 tiles (on a packed
weight), AVX-512 VNNI, AVX2 or plain integer dot products (``convs2s_kernels.extension.int8_kernel_isa()``
says which); inference only."""

from __future__ import annotations

import dataclasses

from ...dispatch import register
from ...extension import native
from ..linear_int8.api import linear_int8_tensors
from ..linear_int8.cpp import CAPABILITY as LINEAR_INT8_CAPABILITY
from ..linear_int8.cpp import _float32_scale_and_bias


def _scale_and_bias_checks(x, qweight, scale, bias=None, packed=None, activation_bits=8):
    """``linear_int8``'s float32 scale and bias checks (``activation_bits`` takes any kernel)."""
    return _float32_scale_and_bias(x, qweight, scale, bias)


CAPABILITY = dataclasses.replace(LINEAR_INT8_CAPABILITY, extra=_scale_and_bias_checks)


def linear_w8a8_cpp(x, qweight, scale, bias=None, packed=None, activation_bits=8):
    lead = x.shape[:-1]
    y = native().linear_w8a8(x.reshape(-1, x.shape[-1]), qweight, scale, bias, packed, activation_bits)
    return y.view(*lead, qweight.shape[0])


def linear_w8a8_tensors(x, qweight, scale, bias=None, packed=None, activation_bits=8):
    """The floating tensors of a call (``linear_int8``'s; ``activation_bits`` is not one)."""
    return linear_int8_tensors(x, qweight, scale, bias)


register("cpp", "linear_w8a8", linear_w8a8_cpp, CAPABILITY, linear_w8a8_tensors)
