"""Input validation shared by the public ops: each failure names the argument and what is wrong."""

from __future__ import annotations

from contextlib import contextmanager
from contextvars import ContextVar
from typing import Iterator, Optional, Sequence

import torch

_TRUSTED = ContextVar("convs2s_kernels_trusted_indices", default=False)


@contextmanager
def trusted_indices() -> Iterator[None]:
    """Inside the block the ops skip the range checks of index tensors (``beam_index``,
    ``src_lengths``), which need their values on the host: a search loop whose indices come from
    ``topk`` checks them once per batch instead of paying a host read per op and step. Shapes,
    dtypes and devices are still checked; the C++ kernels still check ranges where they read."""
    token = _TRUSTED.set(True)
    try:
        yield
    finally:
        _TRUSTED.reset(token)


def indices_trusted() -> bool:
    """Whether the caller vouched for the index ranges (:func:`trusted_indices`)."""
    return _TRUSTED.get()


def check_tensor(name: str, t, ndim: int, *, floating: bool = True) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() != ndim:
        raise ValueError(f"{name} must have {ndim} dimensions, got shape {tuple(t.shape)}")
    if floating and not t.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor, got {t.dtype}")


def check_shape(name: str, t: torch.Tensor, expected: Sequence[Optional[int]], meaning: str) -> None:
    """``expected`` holds sizes or None for "any"; ``meaning`` spells the contract, e.g. '(B, T, C)'."""
    ok = len(expected) == t.dim() and all(e is None or e == s for e, s in zip(expected, t.shape))
    if not ok:
        want = tuple("*" if e is None else e for e in expected)
        raise ValueError(f"{name} must have shape {meaning} = {want}, got {tuple(t.shape)}")


def check_same(ref_name: str, ref: torch.Tensor, **others: Optional[torch.Tensor]) -> None:
    """Every given tensor shares ``ref``'s device and dtype (masks and indices excluded by the caller)."""
    for name, t in others.items():
        if t is None:
            continue
        if t.device != ref.device:
            raise ValueError(f"{name} is on {t.device} but {ref_name} is on {ref.device}")
        if t.dtype != ref.dtype:
            raise TypeError(f"{name} has dtype {t.dtype} but {ref_name} has {ref.dtype}; cast them to one dtype")


def check_index(name: str, t: torch.Tensor, length: int, device: torch.device, *, low: int = 0, high: int) -> None:
    """1-D integer tensor of ``length`` entries in ``[low, high]`` on ``device``."""
    check_tensor(name, t, 1, floating=False)
    if t.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"{name} must be int32 or int64, got {t.dtype}")
    if t.shape[0] != length:
        raise ValueError(f"{name} must have {length} entries, got {t.shape[0]}")
    if t.device != device:
        raise ValueError(f"{name} is on {t.device} but the inputs are on {device}")
    # A range check needs the values on the host: skip it on accelerators to avoid a sync per call,
    # and while torch.compile traces (values are unknown then; the C++ kernels check them again).
    if t.device.type == "cpu" and t.numel() > 0 and not torch.compiler.is_compiling() and not _TRUSTED.get():
        lo, hi = int(t.min()), int(t.max())
        if lo < low or hi > high:
            raise ValueError(f"{name} values must lie in [{low}, {high}], got min {lo}, max {hi}")


def write_version(t: torch.Tensor) -> Optional[int]:
    """``t._version`` (moved on by every in-place write), what the once-per-tensor checks and the
    model's derived copies key on; None for an inference tensor (made under
    ``torch.inference_mode()``), which keeps no version counter: such a tensor can only be written
    inside inference mode, and a write there goes unseen (keyed on its storage alone)."""
    return None if t.is_inference() else t._version
