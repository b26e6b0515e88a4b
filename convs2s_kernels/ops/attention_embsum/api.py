"""``attention_embsum``: the public function (checks its inputs, then calls the backend the dispatcher picks)."""

from __future__ import annotations

from typing import Optional

import torch

from ..._checks import check_index, check_same, check_shape, check_tensor
from ...dispatch import resolve
from .._common import autocast_inputs

__all__ = ["attention_embsum", "attention_tensors"]


def attention_tensors(q, z, y, src_lengths=None, **_):
    """The floating tensors of a call, the activation first (for the backends' capabilities)."""
    return q, z, y


def attention_embsum(q: torch.Tensor, z: torch.Tensor, y: torch.Tensor, src_lengths: Optional[torch.Tensor] = None,
                     *, left_pad: bool = True, return_attn: bool = False, backend: Optional[str] = None):
    """Attention over source positions with values ``z + e`` and the ``sqrt(s)`` scale.

    ``q (B, T, E)``, ``z (B, S, E)``, ``y (B, S, E)``, ``src_lengths (B,)`` true lengths in
    ``[1, S]`` (None: no padding) -> ``context (B, T, E)`` [and ``attn (B, T, S)``].
    See :func:`convs2s_kernels.attention_embsum_ref`.
    """
    check_tensor("q", q, 3)
    check_tensor("z", z, 3)
    check_tensor("y", y, 3)
    B, _, E = q.shape
    S = z.shape[1]
    check_shape("z", z, (B, None, E), "(B, S, E)")
    check_shape("y", y, (B, S, E), "(B, S, E)")
    if S == 0:
        raise ValueError("z has no source positions (S = 0)")
    q, z, y = autocast_inputs(q.device, q, z, y)
    check_same("q", q, z=z, y=y)
    if src_lengths is not None:
        check_index("src_lengths", src_lengths, B, q.device, low=1, high=S)
    kwargs = dict(left_pad=left_pad, return_attn=return_attn)
    fn = resolve("attention_embsum", q.device, backend, q, z, y, src_lengths, **kwargs)
    return fn(q, z, y, src_lengths, **kwargs)
