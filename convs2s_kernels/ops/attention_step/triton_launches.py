"""``attention_step``'s launch for the GPU check (``python3 -m convs2s_kernels.gpu_check``, see
:mod:`convs2s_kernels.gpu_check.launches` for the interface): a decoding step, on meta tensors."""

from __future__ import annotations

import functools

import torch

from .triton_kernels import attention_step_triton

KERNELS = __package__ + ".triton_kernels"

_meta = functools.partial(torch.empty, device="meta")


def calls(dtype) -> None:
    """A decoding step: 128 sentences x beam 5, C = 512, S = 30, with a residual and the probabilities."""
    B, beam, C, S = 128, 5, 512, 30
    attention_step_triton(_meta(B, beam, C, dtype=dtype), _meta(B, beam, S, dtype=dtype), _meta(B, S, dtype=dtype),
                          _meta(B, S, C, dtype=dtype), _meta(B, S, C, dtype=dtype), _meta(C, dtype=dtype),
                          _meta(B, dtype=torch.int64), _meta(B, beam, C, dtype=dtype), need_attn=True)
