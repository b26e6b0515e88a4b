"""Registers each op's Triton kernels when they can run here, and records why not when they cannot.

``available_backends()`` stays honest on every machine: no triton installed, a kernel module
that fails to import, or no CUDA device without the interpreter each give their reason.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
from typing import Optional

import torch

from .dispatch import set_availability
from .ops import TRITON_OPS

_IMPORT_ERROR: Optional[str] = None
_INTERPRET = False
if importlib.util.find_spec("triton") is None:
    _IMPORT_ERROR = "triton is not installed (pip install triton)"
else:
    try:
        for _op in TRITON_OPS:  # each op's triton.py registers its kernels with the dispatcher
            importlib.import_module(f"{__package__}.ops.{_op}.triton")
        from .triton_common.config import INTERPRET as _INTERPRET
    except Exception as exc:  # a broken triton install must not take the package down
        _IMPORT_ERROR = f"the Triton kernels could not be imported ({type(exc).__name__}: {exc})"


def unavailable_reason() -> Optional[str]:
    """None when the Triton kernels run here (a GPU, or the interpreter), else why not."""
    if _IMPORT_ERROR is not None:
        return _IMPORT_ERROR
    if _INTERPRET or torch.cuda.is_available():
        return None
    if os.environ.get("TRITON_INTERPRET") == "1":
        return "TRITON_INTERPRET=1 was set after convs2s_kernels was imported; set it before the import"
    return "no CUDA device (set TRITON_INTERPRET=1 before importing convs2s_kernels to run the kernels in the interpreter)"


set_availability("triton", unavailable_reason)
