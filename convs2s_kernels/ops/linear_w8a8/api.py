"""``linear_w8a8``: the public function (checks its inputs, then calls the backend the dispatcher picks)."""

from __future__ import annotations

from typing import Optional

import torch

from ..._checks import write_version
from ...dispatch import resolve
from ..linear_int8.api import check_int8_linear_args
from .reference import check_activation_bits, check_weight_bits, pack_w8a8_weight, packed_shape

__all__ = ["linear_w8a8", "check_packed", "check_weight_range"]


def _contents_key(t: torch.Tensor) -> tuple:
    """What a once-per-tensor check keys on: storage and version (moved on by in-place writes), and
    shape and strides (a view shares the first two)."""
    return write_version(t), t.data_ptr(), t.shape, t.stride()


def check_weight_range(qweight: torch.Tensor, weight_bits: int = 8) -> None:
    """No -128 in ``qweight`` (``quantize_int8`` writes [-127, 127]; the AVX2 kernel moves the
    activation's sign onto the weight, and -(-128) wraps); with ``weight_bits`` 7 nothing outside
    [-63, 63] (``quantize_int8(w, bits=7)``; the AVX2 kernel then adds two products' pairs in
    int16, which a wider weight would overflow). Scanned once per weight tensor, version and bits,
    not per call."""
    contents = _contents_key(qweight)
    checked = getattr(qweight, "_convs2s_range_checked", ())
    if (contents, weight_bits) in checked or (contents, 7) in checked:  # [-63, 63] lies within [-127, 127]
        return
    if weight_bits == 7:
        # compared, not abs(): abs(-128) wraps to -128 in int8
        if bool(((qweight < -63) | (qweight > 63)).any()):
            raise ValueError("qweight holds values outside [-63, 63]: weight_bits=7 takes the weights of "
                             "quantize_int8(w, bits=7)")
    elif bool((qweight == -128).any()):
        raise ValueError("qweight holds -128: linear_w8a8 takes int8 weights in [-127, 127], as quantize_int8 writes")
    # kept for this version only (an in-place write moves it on)
    qweight._convs2s_range_checked = tuple(k for k in checked if k[0] == contents) + ((contents, weight_bits),)


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
                *, packed: Optional[torch.Tensor] = None, activation_bits: int = 8, weight_bits: int = 8,
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
    multiply-adds instead of 4). ``weight_bits`` 7: ``qweight`` holds [-63, 63]
    (``quantize_int8(w, bits=7)``, checked once per weight); with 7-bit activations the AVX2 packed
    kernel then adds two products' pairs before widening them (5 instructions per 64 multiply-adds
    instead of 6). The results are the same as with 8 (exact sums). See
    :func:`convs2s_kernels.linear_w8a8_ref`."""
    activation_bits = check_activation_bits(activation_bits)
    weight_bits = check_weight_bits(weight_bits)
    check_int8_linear_args(x, qweight, scale, bias)
    check_weight_range(qweight, weight_bits)
    if packed is not None:
        check_packed(qweight, packed)
    fn = resolve("linear_w8a8", x.device, backend, x, qweight, scale, bias)
    return fn(x, qweight, scale, bias, packed, activation_bits, weight_bits)
