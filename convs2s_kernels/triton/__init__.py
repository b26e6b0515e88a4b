"""The Triton backend: the GPU path of the three fused computations.

Kernels (one module per op, each paired with its reference in :mod:`convs2s_kernels.reference`):

* :mod:`.conv_glu` — ``_conv_glu_fwd_kernel`` and the backward kernels (``dpre``, ``dx``, ``dW``);
* :mod:`.attention` — ``_attention_fwd_kernel`` (online softmax), ``_attention_probs_kernel``,
  ``_attention_bwd_ds_kernel`` and ``_bmm_kernel``;
* :mod:`.conv_step` — ``_conv_step_fwd_kernel`` (gather by beam, shift, append, conv + GLU).

They run on CUDA tensors, and on CPU tensors only when ``TRITON_INTERPRET=1`` was set before
this package was imported (the interpreter: a correctness tool, far too slow to be picked by
``backend="auto"``; name ``"triton"`` to use it).
"""

from __future__ import annotations

from typing import List

import torch

from ..dispatch import register
from ._config import INTERPRET, dtype_reasons
from .attention import attention_embsum_triton
from .conv_glu import conv_glu_triton
from .conv_step import conv_step_triton

__all__ = ["INTERPRET", "conv_glu_triton", "attention_embsum_triton", "conv_step_triton"]


def _device_reasons(op: str, t: torch.Tensor) -> List[str]:
    if t.device.type == "cuda":
        return []
    if t.device.type == "cpu" and INTERPRET:
        return []
    if t.device.type == "cpu":
        return [f"triton {op} runs CPU tensors only under the interpreter "
                "(TRITON_INTERPRET=1 set before convs2s_kernels is imported)"]
    return [f"triton {op} runs CUDA tensors, got {t.device.type}"]


def _conv_glu_check(x, weight, bias=None, **kw) -> List[str]:
    return _device_reasons("conv_glu", x) + dtype_reasons("conv_glu", x)


def _attention_check(q, z, y, src_lengths=None, **kw) -> List[str]:
    return _device_reasons("attention_embsum", q) + dtype_reasons("attention_embsum", q)


def _conv_step_check(x_t, state, weight, bias=None, beam_index=None) -> List[str]:
    why = _device_reasons("conv_step", x_t) + dtype_reasons("conv_step", x_t)
    tensors = (x_t, state, weight, bias)
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors):
        why.append("triton conv_step is a decoding op without a backward; inputs require grad")
    return why


register("triton", "conv_glu", _conv_glu_check)(conv_glu_triton)
register("triton", "attention_embsum", _attention_check)(attention_embsum_triton)
register("triton", "conv_step", _conv_step_check)(conv_step_triton)
