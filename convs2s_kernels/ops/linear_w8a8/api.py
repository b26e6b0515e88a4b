"""``linear_w8a8``: the public function (checks its inputs, then calls the backend the dispatcher picks)."""

from __future__ import annotations

from typing import Optional

import torch

from ...dispatch import resolve
from ..linear_int8.api import check_int8_linear_args

__all__ = ["linear_w8a8"]


def linear_w8a8(x: torch.Tensor, qweight: torch.Tensor, scale: torch.Tensor, bias: Optional[torch.Tensor] = None,
                *, backend: Optional[str] = None) -> torch.Tensor:
    """``x @ W.T + bias`` with ``W = qweight * scale[:, None]`` and ``x`` quantised to int8 per row
    (``quantize_rows_int8``): int8 × int8 dot products with exact int32 sums, for decoding steps
    with many rows, where widening int8 weights to float32 (``linear_int8``) costs more than the
    bytes it saves. ``x (..., K)`` float32, ``qweight (N, K)`` int8 and ``scale (N,)`` from
    :func:`convs2s_kernels.quantize_int8`, ``bias (N,)``; returns float32.
    See :func:`convs2s_kernels.linear_w8a8_ref`."""
    check_int8_linear_args(x, qweight, scale, bias)
    fn = resolve("linear_w8a8", x.device, backend, x, qweight, scale, bias)
    return fn(x, qweight, scale, bias)
