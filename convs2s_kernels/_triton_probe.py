"""Availability of the Triton backend on this machine.

Reports why it cannot run here so ``available_backends()`` is honest on every machine.
"""

from __future__ import annotations

import importlib.util
import os
from typing import Optional

import torch

from .dispatch import _REGISTRY, set_availability


def unavailable_reason() -> Optional[str]:
    if importlib.util.find_spec("triton") is None:
        return "triton is not installed"
    if not _REGISTRY["triton"]:
        return "this version ships no Triton kernels yet"
    if not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
        return "no CUDA device (set TRITON_INTERPRET=1 before import to run the kernels in the interpreter)"
    return None


set_availability("triton", unavailable_reason)
