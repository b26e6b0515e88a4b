"""The conv step's packed weight: made by the cpp glue (:func:`.cpp.pack_conv_step_weight`),
checked here before a backend reads it."""

from __future__ import annotations

import torch

from ...extension import native


def _contents_key(t: torch.Tensor) -> tuple:
    return t.data_ptr(), t._version, tuple(t.shape), t.dtype


def check_packed_weight(packed: torch.Tensor, weight: torch.Tensor) -> None:
    """``packed`` is ``pack_conv_step_weight(weight)``: its shape and dtype each call, its contents
    once per pair of tensors and versions (a stale packing would multiply by another weight)."""
    if not isinstance(packed, torch.Tensor) or packed.dim() != 3 or packed.dtype != weight.dtype:
        got = f"{packed.dtype} {tuple(packed.shape)}" if isinstance(packed, torch.Tensor) else type(packed).__name__
        raise ValueError(f"packed must be pack_conv_step_weight(weight): a {weight.dtype} (blocks, k*C_in, width) "
                         f"tensor, got {got}")
    k, c_in, c2 = weight.shape
    width = packed.shape[2]
    if packed.device != weight.device or packed.shape[1] != k * c_in or packed.shape[0] != -(-c2 // width):
        raise ValueError(f"packed {tuple(packed.shape)} on {packed.device} is not pack_conv_step_weight of this "
                         f"{tuple(weight.shape)} weight on {weight.device}")
    key = (_contents_key(weight), _contents_key(packed))
    if getattr(packed, "_convs2s_packing_checked", None) == key:
        return
    if not torch.equal(packed, native().pack_kn_weight(weight.detach().reshape(k * c_in, c2))):
        raise ValueError("packed is not pack_conv_step_weight(weight): pack the weight again after changing it "
                         "(or in this process: the layout follows the CPU's instruction set)")
    packed._convs2s_packing_checked = key
