"""Loads the Triton backend when it can run here, and records why not when it cannot.

``available_backends()`` stays honest on every machine: no triton installed, a kernel module
that fails to import, or no CUDA device without the interpreter each give their reason.
"""

from __future__ import annotations

import importlib.util
import os
from typing import Optional

import torch

from .dispatch import set_availability

_IMPORT_ERROR: Optional[str] = None
_INTERPRET = False
if importlib.util.find_spec("triton") is None:
    _IMPORT_ERROR = "triton is not installed (pip install triton)"
else:
    try:
        from . import triton as _kernels  # registers the kernels with the dispatcher

        _INTERPRET = _kernels.INTERPRET
    except Exception as exc:  # a broken triton install must not take the package down
        _IMPORT_ERROR = f"the Triton kernels could not be imported ({type(exc).__name__}: {exc})"


def unavailable_reason() -> Optional[str]:
    if _IMPORT_ERROR is not None:
        return _IMPORT_ERROR
    if _INTERPRET or torch.cuda.is_available():
        return None
    if os.environ.get("TRITON_INTERPRET") == "1":
        return "TRITON_INTERPRET=1 was set after convs2s_kernels was imported; set it before the import"
    return "no CUDA device (set TRITON_INTERPRET=1 before importing convs2s_kernels to run the kernels in the interpreter)"


set_availability("triton", unavailable_reason)
