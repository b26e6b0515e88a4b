"""``conv_step``: the public function (checks its inputs, then calls the backend the dispatcher picks)."""

from __future__ import annotations

from typing import Optional, Tuple

import torch

from ..._checks import check_index, check_same, check_shape, check_tensor
from ...dispatch import resolve
from .._common import autocast_inputs, check_conv_weight
from .packing import check_packed_weight

__all__ = ["conv_step", "conv_step_tensors"]


def conv_step_tensors(x_t, state, weight, bias=None, beam_index=None, packed=None):
    """The floating tensors of a call, the activation first (for the backends' capabilities)."""
    return x_t, state, weight, bias


def conv_step(x_t: torch.Tensor, state: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None,
              beam_index: Optional[torch.Tensor] = None, *, packed: Optional[torch.Tensor] = None,
              backend: Optional[str] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    """One incremental step: reorder ``state`` by ``beam_index``, shift, append ``x_t``, conv + GLU.

    ``x_t (N, C_in)``, ``state (N_prev, k-1, C_in)``, ``weight (k, C_in, 2C)``, ``bias (2C,)``,
    ``beam_index (N,)`` parent rows in ``[0, N_prev)`` -> ``(out (N, C), new_state (N, k-1, C_in))``.
    The input state is never modified (parents may repeat). ``packed``:
    ``pack_conv_step_weight(weight)``, which the cpp backend's kernel reads instead of ``weight``
    (the other backends ignore it). See :func:`convs2s_kernels.conv_step_ref`.
    """
    check_tensor("x_t", x_t, 2)
    check_tensor("state", state, 3)
    N, c_in = x_t.shape
    check_conv_weight("x_t", c_in, weight, bias)
    k = weight.shape[0]
    check_shape("state", state, (None, k - 1, c_in), "(N_prev, k-1, C_in)")
    x_t, state, weight, bias = autocast_inputs(x_t.device, x_t, state, weight, bias)
    check_same("x_t", x_t, state=state, weight=weight, bias=bias)
    if beam_index is None:
        if state.shape[0] != N:
            raise ValueError(f"state has {state.shape[0]} rows but x_t has {N}; pass beam_index to map them")
    else:
        check_index("beam_index", beam_index, N, x_t.device, low=0, high=state.shape[0] - 1)
    fn = resolve("conv_step", x_t.device, backend, x_t, state, weight, bias, beam_index)
    if packed is not None:
        check_packed_weight(packed, weight)
    return fn(x_t, state, weight, bias, beam_index, packed)
