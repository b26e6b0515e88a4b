"""Every non-reference backend that runs here against the reference, op by op.

Backends that cannot run on this machine are skipped with the dispatcher's reason; the
reference itself is covered by test_reference_ops.py.
"""

import math

import pytest
import torch

import convs2s_kernels as ck
from convs2s_kernels import dispatch, reference
from convs2s_kernels.testing import assert_close

FAST_BACKENDS = ["cpp", "triton"]


def runnable(backend: str, op: str, *args, **kwargs):
    why = dispatch.reasons(backend, op, torch.device("cpu"), *args, **kwargs)
    if why:
        pytest.skip(f"{backend} cannot run {op} here: {'; '.join(why)}")


def step_inputs(n_prev, n, c_in, c_out, k, dtype):
    x_t = torch.randn(n, c_in, dtype=dtype)
    state = torch.randn(n_prev, k - 1, c_in, dtype=dtype)
    w = (torch.randn(k, c_in, 2 * c_out) / math.sqrt(k * c_in)).to(dtype)
    b = (torch.randn(2 * c_out) * 0.1).to(dtype)
    return x_t, state, w, b


STEP_CASES = [
    pytest.param(5, 5, 16, 8, 3, id="N5_C16_k3"),
    pytest.param(1, 1, 41, 13, 3, id="N1_C41_k3"),
    pytest.param(4, 6, 12, 12, 5, id="N6_k5_from4"),
    pytest.param(3, 3, 24, 48, 1, id="k1"),
    pytest.param(2, 2, 10, 7, 4, id="even_k4"),
]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("n_prev,n,c_in,c_out,k", STEP_CASES)
@pytest.mark.parametrize("backend", FAST_BACKENDS)
@torch.no_grad()
def test_conv_step_matches_reference(backend, n_prev, n, c_in, c_out, k, dtype):
    x_t, state, w, b = step_inputs(n_prev, n, c_in, c_out, k, dtype)
    parents = torch.randint(0, n_prev, (n,))
    parents[0] = parents[-1]  # at least one repeated parent when n > 1
    if n == n_prev:
        cases = [None, parents]
    else:
        cases = [parents]
    runnable(backend, "conv_step", x_t, state, w, b, parents)
    before = state.clone()
    for idx in cases:
        out, new_state = ck.conv_step(x_t, state, w, b, idx, backend=backend)
        want_out, want_state = reference.conv_step_ref(x_t.double(), state.double(), w.double(), b.double(), idx)
        assert_close("conv_step", out, want_out)
        assert torch.equal(new_state, want_state.to(dtype)), "the new state must be an exact copy"
        assert not torch.isnan(out).any()
    assert torch.equal(state, before), "the input state must never be modified"


@pytest.mark.parametrize("backend", FAST_BACKENDS)
@torch.no_grad()
def test_conv_step_strided_inputs(backend):
    """Row-strided x_t and state (slices of larger buffers) give the same result."""
    n, c_in, c_out, k = 4, 12, 6, 3
    big_x = torch.randn(n, 2 * c_in)
    big_state = torch.randn(n, k + 2, c_in)
    x_t, state = big_x[:, :c_in], big_state[:, 1:k]
    _, _, w, b = step_inputs(n, n, c_in, c_out, k, torch.float32)
    runnable(backend, "conv_step", x_t, state, w, b)
    out, new_state = ck.conv_step(x_t, state, w, b, backend=backend)
    want_out, want_state = reference.conv_step_ref(x_t, state, w, b)
    assert_close("conv_step", out, want_out)
    assert torch.equal(new_state, want_state)


@pytest.mark.parametrize("backend", FAST_BACKENDS)
@torch.no_grad()
def test_conv_step_chained_steps_equal_causal_conv(backend):
    """Feeding a backend's own new state back in reproduces the full causal convolution."""
    B, T, c_in, c_out, k = 3, 7, 10, 6, 3
    x = torch.randn(B, T, c_in)
    _, _, w, b = step_inputs(B, B, c_in, c_out, k, torch.float32)
    state = torch.zeros(B, k - 1, c_in)
    runnable(backend, "conv_step", x[:, 0], state, w, b)
    full = reference.conv_glu_ref(x, w, b, causal=True)
    for t in range(T):
        out, state = ck.conv_step(x[:, t], state, w, b, backend=backend)
        assert_close("conv_step", out, full[:, t], what=f"step {t}")
