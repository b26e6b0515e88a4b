"""``attention_embsum`` on the Triton backend (kernels in :mod:`.triton_kernels`): flash-style
forward, backward through the probabilities recomputed from the log-sum-exp."""

from __future__ import annotations

from ...dispatch import register
from ...triton_common.config import capability
from .api import attention_tensors
from .triton_kernels import attention_embsum_triton

CAPABILITY = capability("attention_embsum", backward=True)

register("triton", "attention_embsum", attention_embsum_triton, CAPABILITY, attention_tensors)
