"""What the ops' public functions share: autocast casting and the conv weight check."""

from __future__ import annotations

import torch

from .._checks import check_shape, check_tensor


def autocast_inputs(device: torch.device, *tensors):
    """Under ``torch.autocast``, bring the floating inputs to the autocast dtype, as autocast does
    for PyTorch's own convolutions and matmuls (the ops then see one dtype, and the reference's
    softmax still runs in float32)."""
    if not torch.is_autocast_enabled(device.type):
        return tensors
    dtype = torch.get_autocast_dtype(device.type)
    return tuple(t.to(dtype) if t is not None and t.is_floating_point() else t for t in tensors)


def check_conv_weight(x_name: str, c_in: int, weight, bias) -> int:
    """A ConvTBC weight ``(k, C_in, 2C)`` matching ``c_in``, and its bias; returns ``C``."""
    check_tensor("weight", weight, 3)
    k, w_in, c2 = weight.shape
    if k < 1 or c2 % 2:
        raise ValueError(f"weight must have shape (k >= 1, C_in, 2C) with an even last dimension, got {tuple(weight.shape)}")
    if w_in != c_in:
        raise ValueError(f"weight expects C_in = {w_in} input channels but {x_name} has {c_in}")
    if bias is not None:
        check_tensor("bias", bias, 1)
        check_shape("bias", bias, (c2,), "(2C,)")
    return c2 // 2
