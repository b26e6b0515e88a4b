"""Loader of the C++ CPU extension ``convs2s_kernels._C`` and its registration with the dispatcher.

The package works without the extension (the reference backend covers every op); when it
is missing, :func:`convs2s_kernels.available_backends` reports why.
"""

from __future__ import annotations

import os
from typing import List, Optional

import torch

from .dispatch import register, set_availability

DISABLE_ENV = "CONVS2S_KERNELS_DISABLE_CPP"
_SUPPORTED_DTYPES = (torch.float32, torch.float64, torch.bfloat16)

try:
    from . import _C  # type: ignore[attr-defined]

    _IMPORT_ERROR: Optional[str] = None
except ImportError as exc:  # not built, or built against another torch
    _C = None
    _IMPORT_ERROR = (
        f"the C++ extension convs2s_kernels._C could not be imported ({exc}); "
        "build it with `pip install --no-build-isolation -e .` from the repository root"
    )


def unavailable_reason() -> Optional[str]:
    if os.environ.get(DISABLE_ENV) == "1":
        return f"disabled by {DISABLE_ENV}=1"
    return _IMPORT_ERROR


set_availability("cpp", unavailable_reason)


def _dtype_and_grad_reasons(op: str, *tensors) -> List[str]:
    present = [t for t in tensors if isinstance(t, torch.Tensor) and t.is_floating_point()]
    why = []
    dtype = present[0].dtype
    if dtype not in _SUPPORTED_DTYPES:
        why.append(f"cpp {op} supports {', '.join(str(d) for d in _SUPPORTED_DTYPES)}, got {dtype}")
    if torch.is_grad_enabled() and any(t.requires_grad for t in present):
        why.append(f"cpp {op} has no backward yet; inputs require grad")
    return why


def _conv_step_check(x_t, state, weight, bias=None, beam_index=None) -> List[str]:
    return _dtype_and_grad_reasons("conv_step", x_t, state, weight, bias)


@register("cpp", "conv_step", check=_conv_step_check)
def conv_step_cpp(x_t, state, weight, bias=None, beam_index=None):
    out, new_state = _C.conv_step_forward(x_t, state, weight.contiguous(), bias, beam_index)
    return out, new_state
