"""The conv step's packed weight: made by the cpp glue (:func:`.cpp.pack_conv_step_weight`),
checked here before a backend reads it."""

from __future__ import annotations

import torch

from .._packing import check_packed_matrix


def check_packed_weight(packed: torch.Tensor, weight: torch.Tensor) -> None:
    """``packed`` is ``pack_conv_step_weight(weight)`` (see :func:`.._packing.check_packed_matrix`)."""
    k, c_in, c2 = weight.shape
    check_packed_matrix(packed, weight, weight.reshape(k * c_in, c2), "pack_conv_step_weight")
