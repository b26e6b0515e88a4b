"""``conv_step``: every backend against the reference, the reference against an explicit loop,
the paper's shapes on GPUs, and the input errors."""


import pytest
import torch
import torch.nn.functional as F

import convs2s_kernels as ck
from convs2s_kernels.internal import indices_trusted, trusted_indices
from convs2s_kernels.testing import assert_close
from harness import DTYPES, FAST_BACKENDS, conv_weight, repeated_parents, runnable, step_inputs

STEP_CASES = [
    pytest.param(5, 5, 16, 8, 3, id="N5_C16_k3"),
    pytest.param(1, 1, 41, 13, 3, id="N1_C41_k3"),
    pytest.param(4, 6, 12, 12, 5, id="N6_k5_from4"),
    pytest.param(3, 3, 24, 48, 1, id="k1"),
    pytest.param(2, 2, 10, 7, 4, id="even_k4"),
    # few-row kernel paths: whole 64-column blocks plus a ragged edge, and the 8-row maximum
    pytest.param(6, 6, 33, 40, 3, id="N6_2C80_ragged"),
    pytest.param(8, 8, 64, 64, 3, id="N8_2C128"),
    pytest.param(9, 9, 20, 32, 3, id="N9_gemm_path"),
]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("n_prev,n,c_in,c_out,k", STEP_CASES)
@pytest.mark.parametrize("backend", FAST_BACKENDS)
@torch.no_grad()
def test_conv_step_matches_reference(backend, n_prev, n, c_in, c_out, k, dtype):
    x_t, state, w, b = step_inputs(n_prev, n, c_in, c_out, k, dtype)
    parents = repeated_parents(n_prev, n)
    cases = [None, parents] if n == n_prev else [parents]
    runnable(backend, "conv_step", x_t, state, w, b, parents)
    before = state.clone()
    for idx in cases:
        out, new_state = ck.conv_step(x_t, state, w, b, idx, backend=backend)
        want_out, want_state = ck.conv_step_ref(x_t.double(), state.double(), w.double(), b.double(), idx)
        assert_close("conv_step", out, want_out)
        assert torch.equal(new_state, want_state.to(dtype)), "the new state must be an exact copy"
        assert not torch.isnan(out).any()
    assert torch.equal(state, before), "the input state must never be modified"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("n_prev,n,c_in,c_out,k", STEP_CASES + [pytest.param(40, 64, 70, 45, 3, id="N64_ragged")])
@pytest.mark.parametrize("backend", FAST_BACKENDS)
@torch.no_grad()
def test_conv_step_with_the_packed_weight_matches_reference(backend, n_prev, n, c_in, c_out, k, dtype):
    """``packed=pack_conv_step_weight(weight)``: the cpp kernel reads it (at the row counts the
    kernel choice gives it; unmeasured here: up to 8 rows, the GEMM on the weight beyond), the
    other backends ignore it; same results either way, repeated parents included."""
    x_t, state, w, b = step_inputs(n_prev, n, c_in, c_out, k, dtype)
    packed = ck.pack_conv_step_weight(w)
    if backend == "cpp":
        assert packed is not None and packed.dtype == dtype
    if packed is None:
        pytest.skip("no cpp extension: nothing packs the weight")
    parents = repeated_parents(n_prev, n)
    runnable(backend, "conv_step", x_t, state, w, b, parents)
    out, new_state = ck.conv_step(x_t, state, w, b, parents, packed=packed, backend=backend)
    want_out, want_state = ck.conv_step_ref(x_t.double(), state.double(), w.double(), b.double(), parents)
    assert_close("conv_step", out, want_out)
    assert torch.equal(new_state, want_state.to(dtype))


def test_conv_step_refuses_a_packing_of_another_weight():
    x_t, state, w, b = step_inputs(3, 3, 16, 8, 3, torch.float32)
    packed = ck.pack_conv_step_weight(w)
    if packed is None:
        pytest.skip("no cpp extension: nothing packs the weight")
    with pytest.raises(ValueError, match="packed is not pack_conv_step_weight"):
        ck.conv_step(x_t, state, w + 1, b, packed=packed, backend="cpp")
    with pytest.raises(ValueError, match="not pack_conv_step_weight of this"):
        ck.conv_step(x_t, state[:, :1], w[:2], b, packed=packed, backend="cpp")
    with pytest.raises(ValueError, match="packed must be pack_conv_step_weight"):
        ck.conv_step(x_t, state, w, b, packed=packed.double(), backend="cpp")
    assert ck.pack_conv_step_weight(w.double()) is None  # float64: the kernels do not take it
    with pytest.raises(ValueError, match="takes a \\(k, C_in, 2C\\) conv weight"):
        ck.pack_conv_step_weight(w[0])


def test_a_packing_is_trusted_as_made_and_refused_once_its_weight_changes():
    """pack_conv_step_weight's result is not packed a second time to check it on its first use
    (half of a model's preparation): a packing changed behind its version counter (through
    ``.data``) is used as it is. A weight changed in place after the packing is refused, and a
    packing of a temporary weight never passes for another weight at the same address."""
    x_t, state, w, b = step_inputs(3, 3, 16, 8, 3, torch.float32)
    packed = ck.pack_conv_step_weight(w)
    if packed is None:
        pytest.skip("no cpp extension: nothing packs the weight")
    packed.data.mul_(2)  # no version change: only a second packing would notice
    out, _ = ck.conv_step(x_t, state, w, b, packed=packed, backend="cpp")
    want, _ = ck.conv_step_ref(x_t.double(), state.double(), (2 * w).double(), b.double())
    assert_close("conv_step", out, want)  # trusted as made: no check packed it again
    with torch.no_grad():
        w.add_(1)  # changed in place: the version moves on
    with pytest.raises(ValueError, match="packed is not pack_conv_step_weight"):
        ck.conv_step(x_t, state, w, b, packed=packed, backend="cpp")
    temp = ck.pack_conv_step_weight(w.clone())  # its weight lives as long as the packing
    with pytest.raises(ValueError, match="packed is not pack_conv_step_weight"):
        ck.conv_step(x_t, state, torch.randn_like(w), b, packed=temp, backend="cpp")


@pytest.mark.parametrize("backend", FAST_BACKENDS)
@torch.no_grad()
def test_conv_step_strided_inputs(backend):
    """Row-strided x_t and state (slices of larger buffers) give the same result."""
    n, c_in, c_out, k = 4, 12, 6, 3
    big_x = torch.randn(n, 2 * c_in)
    big_state = torch.randn(n, k + 2, c_in)
    x_t, state = big_x[:, :c_in], big_state[:, 1:k]
    w, b = conv_weight(k, c_in, c_out)
    runnable(backend, "conv_step", x_t, state, w, b)
    out, new_state = ck.conv_step(x_t, state, w, b, backend=backend)
    want_out, want_state = ck.conv_step_ref(x_t, state, w, b)
    assert_close("conv_step", out, want_out)
    assert torch.equal(new_state, want_state)


@pytest.mark.parametrize("backend", FAST_BACKENDS)
@torch.no_grad()
def test_conv_step_chained_steps_equal_causal_conv(backend):
    """Feeding a backend's own new state back in reproduces the full causal convolution."""
    B, T, c_in, c_out, k = 3, 7, 10, 6, 3
    x = torch.randn(B, T, c_in)
    w, b = conv_weight(k, c_in, c_out)
    state = torch.zeros(B, k - 1, c_in)
    runnable(backend, "conv_step", x[:, 0], state, w, b)
    full = ck.conv_glu_ref(x, w, b, causal=True)
    for t in range(T):
        out, state = ck.conv_step(x[:, t], state, w, b, backend=backend)
        assert_close("conv_step", out, full[:, t], what=f"step {t}")


# --- the reference against independent formulations ------------------------------------------
@pytest.mark.parametrize("k", [1, 2, 3, 5])
def test_conv_step_ref_matches_full_causal_conv(k):
    """Stepping through a sequence with the FIFO state equals the causal convolution."""
    B, T, c_in, c_out = 3, 6, 5, 4
    x = torch.randn(B, T, c_in, dtype=torch.float64)
    w, b = conv_weight(k, c_in, c_out, torch.float64)
    full = ck.conv_glu_ref(x, w, b, causal=True)
    state = torch.zeros(B, k - 1, c_in, dtype=torch.float64)
    for t in range(T):
        out, state = ck.conv_step_ref(x[:, t], state, w, b)
        torch.testing.assert_close(out, full[:, t], atol=1e-12, rtol=1e-10)


def test_conv_step_ref_reorder_with_repeated_parents():
    k, c_in, c_out = 3, 4, 2
    w, b = conv_weight(k, c_in, c_out, torch.float64)
    state = torch.randn(4, k - 1, c_in, dtype=torch.float64)
    before = state.clone()
    x_t = torch.randn(5, c_in, dtype=torch.float64)
    parents = torch.tensor([2, 2, 0, 3, 2])
    out, new_state = ck.conv_step_ref(x_t, state, w, b, parents)
    assert torch.equal(state, before), "the input state must not be modified"
    for n, p in enumerate(parents.tolist()):
        window = torch.cat([state[p], x_t[n : n + 1]], 0)
        pre = window.reshape(-1) @ w.reshape(-1, 2 * c_out) + b
        torch.testing.assert_close(out[n], F.glu(pre, dim=-1), atol=1e-12, rtol=1e-10)
        assert torch.equal(new_state[n], window[1:])


# --- GPUs: the paper's shapes at the autotuned block sizes -------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("N,C", [(1, 512), (5, 512), (160, 1024)])
@torch.no_grad()
def test_conv_step_paper_shapes_on_gpu(N, C, dtype):
    dev, k = "cuda", 3
    x_t = torch.randn(N, C, device=dev, dtype=dtype)
    state = torch.randn(N, k - 1, C, device=dev, dtype=dtype)
    w, b = conv_weight(k, C, C, dtype, dev)
    parents = torch.randint(0, N, (N,), device=dev)
    out, new_state = ck.conv_step(x_t, state, w, b, parents, backend="triton")
    want_out, want_state = ck.conv_step_ref(x_t.double(), state.double(), w.double(), b.double(), parents)
    assert_close("conv_step", out, want_out)
    assert torch.equal(new_state, want_state.to(dtype))


# --- input errors -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "call,match",
    [
        (lambda: ck.conv_step(torch.randn(2, 4), torch.randn(2, 1, 4), torch.randn(3, 4, 6)), "state must have shape"),
        (lambda: ck.conv_step(torch.randn(3, 4), torch.randn(2, 2, 4), torch.randn(3, 4, 6)), "pass beam_index"),
        (lambda: ck.conv_step(torch.randn(2, 4), torch.randn(2, 2, 4), torch.randn(3, 4, 6),
                              beam_index=torch.tensor([0, 2])), r"beam_index values must lie in \[0, 1\]"),
        (lambda: ck.conv_step(torch.randn(2, 4), torch.randn(2, 2, 4), torch.randn(3, 4, 6),
                              beam_index=torch.tensor([0.0, 1.0])), "int32 or int64"),
    ],
)
def test_conv_step_bad_inputs_name_the_problem(call, match):
    with pytest.raises((ValueError, TypeError), match=match):
        call()


@torch.no_grad()
def test_trusted_indices_skip_the_host_read_of_the_range_check():
    """Inside ``trusted_indices()`` (a search loop's own topk parents) the range check, which
    reads the indices back to the host, is skipped; shapes and dtypes are still checked."""
    x_t, state, w, b = step_inputs(4, 4, 6, 3, 3, torch.float32)
    parents = torch.tensor([3, 3, 0, 1])
    calls = []
    real_min = torch.Tensor.min
    torch.Tensor.min = lambda self, *a, **k: calls.append("min") or real_min(self, *a, **k)
    try:
        ck.conv_step(x_t, state, w, b, parents, backend="reference")
        checked = len(calls)
        with trusted_indices():
            assert indices_trusted()
            out, _ = ck.conv_step(x_t, state, w, b, parents, backend="reference")
            with pytest.raises(TypeError, match="int32 or int64"):
                ck.conv_step(x_t, state, w, b, parents.float(), backend="reference")
    finally:
        torch.Tensor.min = real_min
    assert checked == 1 and len(calls) == 1, calls
    assert not indices_trusted()
    torch.testing.assert_close(out, ck.conv_step_ref(x_t, state, w, b, parents)[0])
