"""``conv_step``'s launch for the GPU check (``python3 -m convs2s_kernels.gpu_check``, see
:mod:`convs2s_kernels.gpu_check.launches` for the interface): a decoding step, on meta tensors."""

from __future__ import annotations

import functools

import torch

from .triton_kernels import conv_step_triton

KERNELS = __package__ + ".triton_kernels"

_meta = functools.partial(torch.empty, device="meta")


def calls(dtype) -> None:
    """A decoding step: 128 sentences x beam 5, C = 512, k = 3, with the beam reorder and bias."""
    N, C, k = 640, 512, 3
    conv_step_triton(_meta(N, C, dtype=dtype), _meta(N, k - 1, C, dtype=dtype), _meta(k, C, 2 * C, dtype=dtype),
                     _meta(2 * C, dtype=dtype), _meta(N, dtype=torch.int64))
