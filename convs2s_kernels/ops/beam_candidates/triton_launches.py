"""``beam_candidates``' launches for the GPU check (``python3 -m convs2s_kernels.gpu_check``, see
:mod:`convs2s_kernels.gpu_check.launches` for the interface): a decoding step, on meta tensors."""

from __future__ import annotations

import functools

import torch

from .triton_kernels import beam_candidates_triton

KERNELS = __package__ + ".triton_kernels"

_meta = functools.partial(torch.empty, device="meta")


def calls(dtype) -> None:
    """Table 3's step: 128 sentences x beam 5 over fconv_wmt_en_fr's 40k vocabulary, every rule on,
    the step on the device (a recorded search step)."""
    B, beam, V = 128, 5, 40000
    N = B * beam
    beam_candidates_triton(_meta(N, V, dtype=dtype), _meta(N, dtype=torch.float32), beam=beam,
                           step=_meta(1, dtype=torch.int64), max_len=200, min_len=1, unkpen=0.0,
                           forced_len=_meta(N, dtype=torch.int64), ignore=_meta(B, beam, dtype=torch.bool))
