"""The ground truth of ``conv_step``: one incremental causal conv + GLU step in plain PyTorch.

Viewed as ``(k*C_in, 2C)`` the ConvTBC weight is the matrix of the "linearised" convolution, so one
step of decoding is ``window.view(N, k*C_in) @ W``.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch
import torch.nn.functional as F
__all__ = ["conv_step_ref"]


def conv_step_ref(
    x_t: torch.Tensor,
    state: torch.Tensor,
    weight: torch.Tensor,
    bias: Optional[torch.Tensor] = None,
    beam_index: Optional[torch.Tensor] = None,
    packed: Optional[torch.Tensor] = None,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """One step of the causal convolution + GLU with its input FIFO.

    Shapes: ``x_t (N, C_in)`` the new input of each row, ``state (N_prev, k-1, C_in)`` the
    last ``k-1`` inputs (oldest first; zeros before the first step), ``weight (k, C_in, 2C)``,
    ``bias (2C,)``, ``beam_index (N,)`` int64, the parent row in ``state`` of each new row
    (rows may share a parent; ``None`` keeps the order and needs ``N_prev == N``).

    Returns ``(out (N, C), new_state (N, k-1, C_in))``; ``state`` is not modified. ``packed``
    (``pack_conv_step_weight(weight)``, for the cpp kernel) is not read here.

    PyTorch equivalent::

        window = torch.cat([state[beam_index], x_t[:, None]], 1)
        out = F.glu(window.flatten(1) @ weight.flatten(0, 1) + bias, dim=-1); new_state = window[:, 1:]
    """
    if beam_index is not None:
        state = state.index_select(0, beam_index)
    window = torch.cat([state, x_t.unsqueeze(1)], dim=1)
    k, c_in, c2 = weight.shape
    pre = window.reshape(window.shape[0], k * c_in) @ weight.reshape(k * c_in, c2)
    if bias is not None:
        pre = pre + bias
    return F.glu(pre, dim=-1), window[:, 1:].clone()
