"""``beam_update``'s launch for the GPU check (``python3 -m convs2s_kernels.gpu_check``, see
:mod:`convs2s_kernels.gpu_check.launches` for the interface): a decoding step, on meta tensors."""

from __future__ import annotations

import functools

import torch

from .reference import FinishedHypotheses
from ..beam_candidates.reference import BeamCandidates
from .triton_kernels import beam_update_triton

KERNELS = __package__ + ".triton_kernels"

_meta = functools.partial(torch.empty, device="meta")


def calls(dtype) -> None:
    """Table 3's step: 128 sentences x beam 5, up to 200 tokens, 30 source steps, attention kept,
    the step on the device (the search's buffers are fp32 whatever the decoder's dtype)."""
    B, k, L, S = 128, 5, 200, 30
    N, C = B * k, 2 * k
    f32, i64 = torch.float32, torch.int64
    cands = BeamCandidates(_meta(B, C, dtype=f32), _meta(B, C, dtype=i64), _meta(B, C, dtype=i64),
                           _meta(B, C, dtype=torch.bool))
    finished = FinishedHypotheses(_meta(2 * N, L + 1, dtype=i64), _meta(2 * N, L + 1, dtype=f32), _meta(2 * N, dtype=f32),
                                  _meta(2 * N, dtype=i64), _meta(B, dtype=i64), _meta(B, dtype=torch.bool),
                                  _meta(2 * N, S, L + 1, dtype=f32))
    beam_update_triton(cands, _meta(1, dtype=i64), _meta(N, L + 2, dtype=i64), _meta(N, L + 1, dtype=f32),
                       _meta(B, k, dtype=torch.bool), _meta(B, dtype=i64), finished, lenpen=1.0,
                       at_max_len=_meta(1, dtype=torch.bool), attn=_meta(N, S, L + 2, dtype=f32))
