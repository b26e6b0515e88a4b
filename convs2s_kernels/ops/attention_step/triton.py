"""``attention_step`` on the Triton backend (kernel in :mod:`.triton_kernels`); inference only."""

from __future__ import annotations

from ...dispatch import register
from ...triton_common.config import capability
from .api import attention_step_tensors
from .triton_kernels import attention_step_triton

CAPABILITY = capability("attention_step", backward=False)

register("triton", "attention_step", attention_step_triton, CAPABILITY, attention_step_tensors)
