"""``attention_embsum``'s launches for the GPU check (``python3 -m convs2s_kernels.gpu_check``, see
:mod:`convs2s_kernels.gpu_check.launches` for the interface): training and decoding, on meta
tensors."""

from __future__ import annotations

import functools

import torch

from .triton_kernels import attention_backward, attention_forward, fused_max

KERNELS = __package__ + ".triton_kernels"
# the kernels launched more than once by :func:`calls`, each launch named in order
SITES = {"_attention_fwd_kernel": ["", "decode"], "_attention_bwd_fused_kernel": ["", "64", "64-dA"],
         "_bmm_kernel": ["dq", "dz", "dy"]}

_meta = functools.partial(torch.empty, device="meta")


def calls(dtype) -> None:
    """Training (160 x 25 targets over 25 sources, E = 768, left-padded, with the probabilities
    and their gradient: the fused backward, and at its largest tile with and without them), the
    backward of 40 x 100 over 100 (too long for it) and decoding (T = 1: a different specialization)."""
    B, T, S, E = 160, 25, 25, 768
    q, dctx = _meta(B, T, E, dtype=dtype), _meta(B, T, E, dtype=dtype)
    z, y = _meta(B, S, E, dtype=dtype), _meta(B, S, E, dtype=dtype)
    lens = _meta(B, dtype=torch.int64)
    out, attn, lse = attention_forward(q, z, y, lens, True, True)
    attention_backward(dctx, _meta(B, T, S, dtype=dtype), q, z, y, lens, True, out, attn, lse, (True, True, True))
    if fused_max(dtype) == 64:  # the fused backward's largest tile, 64 x 64, without and with dA
        dctx, q, z, y, out = (_meta(B, 64, E, dtype=dtype) for _ in range(5))
        for dattn in (None, _meta(B, 64, 64, dtype=dtype)):
            attention_backward(dctx, dattn, q, z, y, None, True, out, dattn, _meta(B, 64, dtype=torch.float32),
                               (True, True, True))
    Bl, L = 40, 100
    q, dctx, out = (_meta(Bl, L, E, dtype=dtype) for _ in range(3))
    attention_backward(dctx, _meta(Bl, L, L, dtype=dtype), q, _meta(Bl, L, E, dtype=dtype), _meta(Bl, L, E, dtype=dtype),
                       _meta(Bl, dtype=torch.int64), True, out, _meta(Bl, L, L, dtype=dtype),
                       _meta(Bl, L, dtype=torch.float32), (True, True, True))
    attention_forward(_meta(B * 5, 1, E, dtype=dtype), _meta(B * 5, S, E, dtype=dtype),
                      _meta(B * 5, S, E, dtype=dtype), _meta(B * 5, dtype=torch.int64), True, False)
