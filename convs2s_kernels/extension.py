"""Loader of the C++ CPU extension ``convs2s_kernels._C``, and the cpp backend's availability.

The package works without the extension (the reference backend covers every op); when it is
missing, :func:`convs2s_kernels.available_backends` reports why. Each op's cpp glue lives with
the op (``convs2s_kernels/ops/<op>/cpp.py``) and calls the extension through :func:`native`.
"""

from __future__ import annotations

import os
import re
import warnings
from typing import Optional

import torch

from .dispatch import set_availability

DISABLE_ENV = "CONVS2S_KERNELS_DISABLE_CPP"
# caps the few-row kernels' instruction set (read by csrc/small_gemm.cpp when the extension loads)
KERNELS_ISA_ENV = "CONVS2S_KERNELS_ISA"
KERNELS_ISA_LEVELS = ("amx", "avx512", "avx2", "baseline")  # amx: the int8 products' AMX tiles too
# torch releases the whole test suite passed on (README: Install); pyproject's lower bound is the oldest.
# Another release warns once at import and runs if it can: the extension is built against it anyway.
TESTED_TORCH = ("2.13", "2.14")
# dtypes the extension's ops take (few-row kernels narrow it further in their capability)
CPP_DTYPES = (torch.float32, torch.float64, torch.bfloat16)

try:
    from . import _C  # type: ignore[attr-defined]

    _IMPORT_ERROR: Optional[str] = None
except ImportError as exc:  # not built, or built against another torch
    _C = None
    # Python words a module that is not there as a "circular import" (the package is half
    # initialised at this point): say plainly when no build of the extension is present
    _BUILT = any(name.startswith("_C.") for name in os.listdir(os.path.dirname(os.path.abspath(__file__))))
    # an undefined symbol: built against another torch release than the one now installed
    _STALE = " (built against another torch than the installed " + torch.__version__ + ")" \
        if "undefined symbol" in str(exc) else ""
    _IMPORT_ERROR = (
        f"the C++ extension convs2s_kernels._C could not be imported{_STALE} "
        f"({exc if _BUILT else 'it is not built'}); "
        "build it with `pip install --no-build-isolation -e .` from the repository root"
    )


class UntestedTorchWarning(UserWarning):
    """The installed torch is a release the test suite has not run on."""


def untested_torch(version: str = torch.__version__) -> Optional[str]:
    """One line when ``version`` is outside :data:`TESTED_TORCH`, else None."""
    release = ".".join(re.findall(r"\d+", version)[:2])
    if release in TESTED_TORCH:
        return None
    return (f"torch {version} is not among the releases convs2s was tested with ({', '.join(TESTED_TORCH)}); "
            "it runs if it can, and a failure is worth reporting with this line")


def unavailable_reason() -> Optional[str]:
    """None when the cpp backend runs here, else why not (not built, or switched off)."""
    if os.environ.get(DISABLE_ENV) == "1":
        return f"disabled by {DISABLE_ENV}=1"
    return _IMPORT_ERROR


def native():
    """The extension module itself (its raw entry points, for the ops' glue, tests and tools);
    raises ``RuntimeError`` with the reason when it is not importable."""
    if _C is None:
        raise RuntimeError(_IMPORT_ERROR)
    return _C


def small_gemm_isa() -> Optional[str]:
    """The instruction set the few-row kernels picked on this CPU (None without the extension)."""
    return None if _C is None else _C.small_gemm_isa()


def int8_kernel_isa() -> Optional[str]:
    """The int8 x int8 kernel of ``linear_w8a8`` on this CPU: ``amx-int8`` (AMX tiles on a packed
    weight, VNNI otherwise), ``avx512-vnni``, ``avx2`` or ``baseline`` (after ``CONVS2S_KERNELS_ISA``'s
    cap; None without the extension)."""
    return None if _C is None else _C.linear_w8a8_isa()


if os.environ.get(KERNELS_ISA_ENV, KERNELS_ISA_LEVELS[0]) not in KERNELS_ISA_LEVELS:  # the C++ side ignores it
    warnings.warn(f"{KERNELS_ISA_ENV}={os.environ[KERNELS_ISA_ENV]!r} is not one of {', '.join(KERNELS_ISA_LEVELS)}; "
                  "ignored (the few-row kernels use the best instruction set of this CPU)")

if untested_torch():  # one line: no source line for the warning machinery to print beneath it
    warnings.warn_explicit(untested_torch(), UntestedTorchWarning, "convs2s_kernels", 0)

set_availability("cpp", unavailable_reason)
