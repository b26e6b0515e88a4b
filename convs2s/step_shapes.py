"""The weights one decoding step multiplies, named as the kernel choice keys them
(:mod:`convs2s_kernels.tune`), so that the decoder can have the few-row kernels measured against
the GEMM for exactly its shapes before it decodes."""

from __future__ import annotations

from typing import List

import torch
import torch.nn as nn

from convs2s_kernels.tune import Shape, stream_mb

from .layers import ConvTBCWeight, WeightNormed

_DTYPES = {torch.float32: "float32", torch.bfloat16: "bfloat16"}


def _weight_bytes(module: nn.Module) -> int:
    """The bytes of ``module``'s weight that a step reads (int8 when quantised)."""
    if isinstance(module, WeightNormed):
        K = module.kernel_width * module.in_channels if isinstance(module, ConvTBCWeight) else module.in_features
        N = module.out_channels if isinstance(module, ConvTBCWeight) else module.out_features
        return K * N * (1 if module.use_int8 else module.bias.element_size())
    return module.weight.numel() * module.weight.element_size()


def _shape(module: nn.Module, stream: int) -> List[Shape]:
    """A conv weight is (K, N) = (k * C_in, 2C) for float steps; int8 ones are quantised per
    output row, (N, K); Linear weights are (N, K) either way. With int8 activations there is no
    choice to measure."""
    if isinstance(module, ConvTBCWeight):
        K, N, form = module.kernel_width * module.in_channels, module.out_channels, "kn"
    elif isinstance(module, WeightNormed):
        K, N, form = module.in_features, module.out_features, "nk"
    else:  # a plain nn.Linear (fc3 tied to the target embedding) runs F.linear, never the kernels
        return []
    if isinstance(module, WeightNormed) and module.use_int8:
        # int8 activations run linear_w8a8, whose kernel follows thresholds measured once per kernel
        # (csrc/linear_w8a8_cpu.cpp: AMX from 2 rows on a packed weight, ...): nothing for the tuner
        return [] if module.int8_activations else [Shape("nk", "int8", K, N, stream)]
    dtype = _DTYPES.get(module.bias.dtype)
    return [] if dtype is None else [Shape(form, dtype, K, N, stream)]  # float64: the kernels do not take it


def step_weight_modules(decoder: nn.Module) -> List[nn.Module]:
    """What a step with folded attention multiplies: fc1, every residual projection and
    convolution, fc2 and fc3, in that order (the attention projections are folded per sentence)."""
    return [decoder.fc1, *[p for p in decoder.projections if p is not None], *decoder.convolutions,
            decoder.fc2, decoder.fc3]


def step_weight_shapes(decoder: nn.Module) -> List[Shape]:
    """The shapes of :func:`step_weight_modules` that run the kernels, in order (no repeats), each
    to be timed as cold as the step leaves it: after the step's whole weight set (stream_mb)."""
    modules = step_weight_modules(decoder)
    stream = stream_mb(sum(_weight_bytes(m) for m in modules))
    return list(dict.fromkeys(s for m in modules for s in _shape(m, stream)))
