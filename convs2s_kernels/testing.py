"""Tolerances and comparison helpers shared by the tests and the benchmarks.

Inputs in the tests are scaled like the model's real activations (about unit variance,
weights ~ 1/sqrt(fan-in)), so these absolute tolerances are meaningful.
"""

from __future__ import annotations

import os
from typing import Dict, List, Tuple

import torch

REQUIRE_ENV = "CONVS2S_REQUIRE_BACKENDS"


def required_backends() -> List[str]:
    """The backends ``CONVS2S_REQUIRE_BACKENDS`` (comma-separated) says must run here: a suite
    fails, instead of skipping, a case whose backend among them is missing (CI sets cpp,triton)."""
    from .dispatch import available_backends

    names = [n.strip() for n in os.environ.get(REQUIRE_ENV, "").split(",") if n.strip()]
    unknown = sorted(set(names) - set(available_backends()))
    if unknown:
        raise ValueError(f"{REQUIRE_ENV} names unknown backends {unknown}; choose from {sorted(available_backends())}")
    return names

# TOLERANCES[op][dtype] = (atol, rtol) for forward outputs against the reference in that dtype.
TOLERANCES: Dict[str, Dict[torch.dtype, Tuple[float, float]]] = {
    "conv_glu": {torch.float64: (1e-10, 1e-9), torch.float32: (2e-5, 1e-4), torch.float16: (4e-3, 4e-3),
                 torch.bfloat16: (3e-2, 2e-2)},
    "attention_embsum": {torch.float64: (1e-10, 1e-9), torch.float32: (2e-5, 1e-4), torch.float16: (4e-3, 4e-3),
                         torch.bfloat16: (3e-2, 2e-2)},
    "attention_step": {torch.float64: (1e-10, 1e-9), torch.float32: (2e-5, 1e-4), torch.float16: (4e-3, 4e-3),
                       torch.bfloat16: (3e-2, 2e-2)},
    "conv_step": {torch.float64: (1e-10, 1e-9), torch.float32: (2e-5, 1e-4), torch.float16: (4e-3, 4e-3),
                  torch.bfloat16: (3e-2, 2e-2)},
    "linear_int8": {torch.float64: (1e-10, 1e-9), torch.float32: (2e-5, 1e-4)},
    # integer sums exact on every backend: only the final float32 scale-and-add rounds
    "linear_w8a8": {torch.float32: (1e-6, 1e-6)},
    "linear": {torch.float64: (1e-10, 1e-9), torch.float32: (2e-5, 1e-4), torch.float16: (4e-3, 4e-3),
               torch.bfloat16: (3e-2, 2e-2)},
}


def assert_close(op: str, actual: torch.Tensor, expected: torch.Tensor, what: str = "output") -> None:
    """``torch.testing.assert_close`` with the op's tolerance for ``actual``'s dtype."""
    atol, rtol = TOLERANCES[op][actual.dtype]
    torch.testing.assert_close(
        actual, expected.to(actual.dtype), atol=atol, rtol=rtol,
        msg=lambda m: f"{op} {what} ({actual.dtype}) differs from the reference:\n{m}",
    )
