"""``linear_w8a8``: the public function (checks its inputs, then calls the backend the dispatcher picks)."""

from __future__ import annotations

from typing import Optional

import torch

from ...dispatch import resolve
from ..linear_int8.api import check_int8_linear_args
from .reference import check_activation_bits, pack_w8a8_weight, packed_shape

__all__ = ["linear_w8a8", "check_packed", "check_weight_range"]


def _contents_key(t: torch.Tensor) -> tuple:
    """What a once-per-tensor check keys on: storage and version (moved on by in-place writes), and
    shape and strides (a view shares the first two)."""
    return t._version, t.data_ptr(), t.shape, t.stride()


def check_weight_range(qweight: torch.Tensor) -> None:
    """No -128 in ``qweight`` (``quantize_int8`` writes [-127, 127]; the AVX2 kernel moves the
    activation's sign onto the weight, and -(-128) wraps). Scanned once per weight tensor and
    version, not per call."""
    key = _contents_key(qweight)
    if getattr(qweight, "_convs2s_range_checked", None) == key:
        return
    if bool((qweight == -128).any()):
        raise ValueError("qweight holds -128: linear_w8a8 takes int8 weights in [-127, 127], as quantize_int8 writes")
    qweight._convs2s_range_checked = key


def check_packed(qweight: torch.Tensor, packed: torch.Tensor) -> None:
    """``packed`` is ``pack_w8a8_weight(qweight)``: shape and dtype each call, the contents once per
    pair of tensors and versions (a stale packing would give another weight's products)."""
    want = packed_shape(*qweight.shape)
    if not isinstance(packed, torch.Tensor) or packed.dtype != torch.int8 or tuple(packed.shape) != want:
        got = (f"{packed.dtype} {tuple(packed.shape)}" if isinstance(packed, torch.Tensor) else type(packed).__name__)
        raise ValueError(f"packed must be pack_w8a8_weight(qweight): int8 {want}, got {got}")
    if packed.device != qweight.device:
        raise ValueError(f"packed is on {packed.device} but qweight is on {qweight.device}")
    key = (_contents_key(qweight), _contents_key(packed))
    if getattr(packed, "_convs2s_packing_checked", None) == key:
        return
    if not torch.equal(packed, pack_w8a8_weight(qweight)):
        raise ValueError("packed is not pack_w8a8_weight(qweight): pack the weight again after changing it")
    packed._convs2s_packing_checked = key


def linear_w8a8(x: torch.Tensor, qweight: torch.Tensor, scale: torch.Tensor, bias: Optional[torch.Tensor] = None,
                *, packed: Optional[torch.Tensor] = None, activation_bits: int = 8,
                backend: Optional[str] = None) -> torch.Tensor:
    """``x @ W.T + bias`` with ``W = qweight * scale[:, None]`` and ``x`` quantised to int8 per row
    (``quantize_rows_int8``): int8 × int8 dot products with exact int32 sums, for decoding steps
    with many rows, where widening int8 weights to float32 (``linear_int8``) costs more than the
    bytes it saves. ``x (..., K)`` float32 (finite), ``qweight (N, K)`` int8 in [-127, 127] and
    ``scale (N,)`` from :func:`convs2s_kernels.quantize_int8`, ``bias (N,)``; returns float32.
    ``packed``: :func:`convs2s_kernels.pack_w8a8_weight` of ``qweight``, made once per weight, lets the
    cpp kernels skip rearranging the weight on every call (same results, faster at every row count).
    ``activation_bits``: 8 quantises ``x`` to [-127, 127]; 7 to [-63, 63], coarser, but on AVX2
    CPUs without VNNI the packed kernel then multiplies without moving signs (3 instructions per 32
    multiply-adds instead of 4). See :func:`convs2s_kernels.linear_w8a8_ref`."""
    activation_bits = check_activation_bits(activation_bits)
    check_int8_linear_args(x, qweight, scale, bias)
    check_weight_range(qweight)
    if packed is not None:
        check_packed(qweight, packed)
    fn = resolve("linear_w8a8", x.device, backend, x, qweight, scale, bias)
    return fn(x, qweight, scale, bias, packed, activation_bits)
