"""``beam_candidates`` on the Triton backend (kernels in :mod:`.triton_kernels`): two launches a
step, no host read; the step may be a device tensor (a recorded search step)."""

from __future__ import annotations

import dataclasses

from ...dispatch import register
from ...triton_common.config import capability
from .api import beam_candidates_tensors
from .triton_kernels import beam_candidates_triton

MAX_BEAM = 16  # each lane keeps 2 * beam slots in registers


def _limits(logits, prev_scores=None, *, beam, **kwargs):
    if beam > MAX_BEAM:
        return [f"triton beam_candidates takes beams up to {MAX_BEAM}, got {beam}"]
    return []


CAPABILITY = dataclasses.replace(capability("beam_candidates", backward=False), extra=_limits)

register("triton", "beam_candidates", beam_candidates_triton, CAPABILITY, beam_candidates_tensors)
