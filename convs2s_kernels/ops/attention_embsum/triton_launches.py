"""``attention_embsum``'s launches for the GPU check (``python3 -m convs2s_kernels.gpu_check``, see
:mod:`convs2s_kernels.gpu_check.launches` for the interface): training and decoding, on meta
tensors."""

from __future__ import annotations

import functools

import torch

from .triton_kernels import attention_backward, attention_forward

KERNELS = __package__ + ".triton_kernels"
# the kernels launched more than once by :func:`calls`, each launch named in order
SITES = {"_attention_fwd_kernel": ["", "decode"], "_bmm_kernel": ["dq", "dz", "dy"]}

_meta = functools.partial(torch.empty, device="meta")


def calls(dtype) -> None:
    """Training (160 x 25 targets over 25 sources, E = 768, left-padded, with the probabilities
    and their gradient) and decoding (T = 1: a different specialization)."""
    B, T, S, E = 160, 25, 25, 768
    q, dctx = _meta(B, T, E, dtype=dtype), _meta(B, T, E, dtype=dtype)
    z, y = _meta(B, S, E, dtype=dtype), _meta(B, S, E, dtype=dtype)
    lens = _meta(B, dtype=torch.int64)
    out, attn, lse = attention_forward(q, z, y, lens, True, True)
    attention_backward(dctx, _meta(B, T, S, dtype=dtype), q, z, y, lens, True, out, attn, lse, (True, True, True))
    attention_forward(_meta(B * 5, 1, E, dtype=dtype), _meta(B * 5, S, E, dtype=dtype),
                      _meta(B * 5, S, E, dtype=dtype), _meta(B * 5, dtype=torch.int64), True, False)
