"""What every Triton kernel of the package shares: interpreter mode, autotune configs, dtypes.

``TRITON_INTERPRET=1`` must be set before these modules are imported: ``@triton.jit`` decides at
decoration time whether a kernel is compiled for a GPU or run by the interpreter (numpy on the
CPU). Under the interpreter each kernel runs one fixed, small config instead of autotuning.
"""

from __future__ import annotations

import os
from typing import Dict, List

import torch
import triton
import triton.language as tl

from ..dispatch import Capability

# Read once, at import: the kernels below are decorated in this mode whatever the variable says later.
INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"

# dtypes the kernels take: fp16/bf16 inputs accumulate in fp32; fp64 only under the interpreter
# (tl.dot has no fp64 path on GPUs; it is there so gradcheck can run on the CPU), and bf16 only on
# GPUs (the interpreter cannot do bf16 arithmetic).
GPU_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
INTERPRETER_DTYPES = (torch.float64, torch.float32, torch.float16)


def capability(op: str, backward: bool) -> Capability:
    """What the Triton ``op`` takes: CUDA tensors in fp32/fp16/bf16; CPU tensors only under the
    interpreter, in fp64/fp32/fp16."""
    dtypes = {"cuda": GPU_DTYPES}
    hints = {}
    if INTERPRET:
        dtypes["cpu"] = INTERPRETER_DTYPES
        hints[torch.bfloat16] = f"triton {op}: the Triton interpreter cannot do bf16 arithmetic (bf16 runs on GPUs)"
    device_hint = "" if INTERPRET else (" (CPU tensors run only under the interpreter: TRITON_INTERPRET=1 set "
                                        "before convs2s_kernels is imported)")
    return Capability(dtypes, backward=backward, device_hint=device_hint, dtype_hints=hints)


def bucket(n: int) -> int:
    """An autotune key for a size that varies from call to call (source lengths, rows): the next
    power of two (at least 16), so that a new sentence length does not tune again."""
    return max(16, 1 << max(0, n - 1).bit_length())


def acc_type(dtype: torch.dtype):
    """The accumulator type: fp64 for fp64 inputs, fp32 for everything else."""
    return tl.float64 if dtype == torch.float64 else tl.float32


def dot_precision(dtype: torch.dtype) -> str:
    """fp32 products in full IEEE precision unless the user allowed TF32 for matmuls, as PyTorch does."""
    if dtype == torch.float32 and torch.backends.cuda.matmul.allow_tf32:
        return "tf32"
    return "ieee"


POISON_ENV = "CONVS2S_KERNELS_POISON"


def new_empty(*shape: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """``torch.empty`` for every buffer a kernel writes; NaN-filled when ``CONVS2S_KERNELS_POISON=1``
    (the tests set it), so an element a kernel forgets to write shows up as NaN."""
    if os.environ.get(POISON_ENV) == "1":
        return torch.full(shape, float("nan"), dtype=dtype, device=device)
    return torch.empty(shape, dtype=dtype, device=device)


def configs(gpu: List[Dict[str, int]], interpreter: Dict[str, int]) -> List[triton.Config]:
    """Autotune candidates: ``gpu`` entries hold block sizes plus ``num_warps``/``num_stages``;
    under the interpreter the single ``interpreter`` config (warps and stages mean nothing there)."""
    if INTERPRET:
        return [triton.Config(dict(interpreter), num_warps=1, num_stages=1)]
    out = []
    for entry in gpu:
        blocks = {k: v for k, v in entry.items() if k not in ("num_warps", "num_stages")}
        out.append(triton.Config(blocks, num_warps=entry.get("num_warps", 4), num_stages=entry.get("num_stages", 3)))
    return out
