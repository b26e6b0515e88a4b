"""The shared harness of the op tests: backends, dtypes, input builders, tolerances, gradients.

Every op's file (``tests/ops/test_<op>.py``) checks each backend that runs here against the op's
plain-PyTorch reference, computed in float64. A backend that cannot take a case is skipped with
the dispatcher's reason (cpp has no fp16; the interpreter no bf16) -- unless the backend itself is
missing and ``CONVS2S_REQUIRE_BACKENDS`` names it: then the case fails with the reason (CI sets
``CONVS2S_REQUIRE_BACKENDS=cpp,triton``, so a broken build cannot go green).

Buffers the kernels allocate start as NaN (``tests/conftest.py``), so an element a kernel
forgets to write fails the comparison.
"""

from __future__ import annotations

import math

import pytest
import torch

import convs2s_kernels as ck
from convs2s_kernels.testing import REQUIRE_ENV, required_backends  # noqa: F401  (the tests import them from here)

FAST_BACKENDS = ["cpp", "triton"]
DTYPES = [torch.float64, torch.float32, torch.float16, torch.bfloat16]
# Gradients: L2 error relative to the reference gradient's norm, floored at 1 so that a zero
# reference gradient (one source step: the softmax is constant) demands an absolute error.
GRAD_RTOL = {torch.float64: 1e-9, torch.float32: 1e-4, torch.float16: 4e-3, torch.bfloat16: 3e-2}


def require_or_skip(backend: str) -> None:
    """Skip when ``backend`` does not run on this machine -- or fail, when it is required."""
    why = ck.available_backends()[backend]
    if why is None:
        return
    if backend in required_backends():
        pytest.fail(f"the {backend} backend is required ({REQUIRE_ENV}) but unavailable: {why}")
    pytest.skip(f"{backend} backend unavailable: {why}")


def runnable(backend: str, op: str, *args, **kwargs) -> None:
    """Skip when ``backend`` refuses these inputs (with its reasons); see :func:`require_or_skip`."""
    require_or_skip(backend)
    first = args[0] if isinstance(args[0], torch.Tensor) else args[0][0]  # a list: nag_step's parameters
    why = ck.backend_reasons(backend, op, first.device, *args, **kwargs)
    if why:
        pytest.skip(f"{backend} cannot run {op} here: {'; '.join(why)}")


def relative_error(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm().clamp_min(1.0)).item()


def assert_grads_close(grads, want, names, dtype) -> None:
    for name, g, w in zip(names, grads, want):
        assert g.dtype == dtype and g.shape == w.shape, f"grad of {name}: {g.dtype} {tuple(g.shape)}"
        err = relative_error(g, w)
        assert err < GRAD_RTOL[dtype], f"grad of {name}: relative error {err}"


def conv_weight(k: int, c_in: int, c_out: int, dtype=torch.float32, device="cpu"):
    """A ConvTBC weight ``(k, C_in, 2C)`` ~ 1/sqrt(fan-in) and its bias, as the model has them."""
    w = (torch.randn(k, c_in, 2 * c_out, device=device) / math.sqrt(k * c_in)).to(dtype)
    b = (0.1 * torch.randn(2 * c_out, device=device)).to(dtype)
    return w, b


def step_inputs(n_prev, n, c_in, c_out, k, dtype):
    """``(x_t, state, weight, bias)`` of a conv step."""
    x_t = torch.randn(n, c_in, dtype=dtype)
    state = torch.randn(n_prev, k - 1, c_in, dtype=dtype)
    return (x_t, state, *conv_weight(k, c_in, c_out, dtype))


def conv_inputs(B, T, c_in, c_out, k, dtype, requires_grad=False):
    """``[x, weight, bias, residual]`` of a conv + GLU."""
    x = torch.randn(B, T, c_in, dtype=dtype)
    w, b = conv_weight(k, c_in, c_out, dtype)
    res = torch.randn(B, T, c_out, dtype=dtype)
    return [t.requires_grad_(requires_grad) for t in (x, w, b, res)]


def repeated_parents(n_prev: int, n: int) -> torch.Tensor:
    """Random parent rows with at least one parent shared by two rows (when n > 1)."""
    parents = torch.randint(0, n_prev, (n,))
    parents[0] = parents[-1]
    return parents


def bench_script(name: str):
    """A bench/tools/<name>.py script loaded as a module (bench/tools/ is scripts, not a package)."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "bench" / "tools" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def assert_runs_at_isa(code: str, cap: str) -> None:
    """Run ``code`` in a fresh interpreter with the project's kernels capped to ``cap``
    (``CONVS2S_KERNELS_ISA``: read once a process, so each cap needs its own), the op tests'
    folder as ``sys.argv[1]`` (importable from there), and fail with its stderr unless it exits 0."""
    import os
    import subprocess
    import sys

    require_or_skip("cpp")
    here = os.path.dirname(os.path.abspath(__file__))
    out = subprocess.run([sys.executable, "-c", code, here], capture_output=True, text=True, timeout=300,
                         env=dict(os.environ, CONVS2S_KERNELS_ISA=cap))
    assert out.returncode == 0, out.stderr[-2000:]
