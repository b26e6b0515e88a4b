"""Every non-reference backend that runs here against the reference, op by op.

CPU tensors: the cpp backend, and the Triton kernels under the interpreter (tests/conftest.py
sets ``TRITON_INTERPRET=1`` when there is no GPU, and poisons the kernels' output buffers with
NaN). A backend that cannot take a case is skipped with the dispatcher's reason (cpp has no
fp16; the interpreter no bf16, which tests/test_triton_gpu.py covers on GPUs). The reference
itself is covered by test_reference_ops.py.
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
    # few-row kernel paths: whole 64-column blocks plus a ragged edge, and the 8-row maximum
    pytest.param(6, 6, 33, 40, 3, id="N6_2C80_ragged"),
    pytest.param(8, 8, 64, 64, 3, id="N8_2C128"),
    pytest.param(9, 9, 20, 32, 3, id="N9_gemm_path"),
]


DTYPES = [torch.float64, torch.float32, torch.float16, torch.bfloat16]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
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


# --- conv + GLU, forward and backward ---------------------------------------------------------
# Gradients: L2 error relative to the reference gradient's norm, floored at 1 so that a zero
# reference gradient (one source step: the softmax is constant) demands an absolute error.
GRAD_RTOL = {torch.float64: 1e-9, torch.float32: 1e-4, torch.float16: 4e-3, torch.bfloat16: 3e-2}


def conv_inputs(B, T, c_in, c_out, k, dtype, requires_grad=False):
    g = dict(dtype=dtype)
    x = torch.randn(B, T, c_in, **g)
    w = (torch.randn(k, c_in, 2 * c_out) / math.sqrt(k * c_in)).to(dtype)
    b = (0.1 * torch.randn(2 * c_out)).to(dtype)
    res = torch.randn(B, T, c_out, **g)
    return [t.requires_grad_(requires_grad) for t in (x, w, b, res)]


CONV_CASES = [
    pytest.param(2, 7, 16, 8, 3, True, id="causal_k3"),
    pytest.param(3, 5, 13, 7, 3, False, id="centred_k3_odd_C"),
    pytest.param(2, 6, 12, 10, 4, False, id="centred_even_k4"),
    pytest.param(2, 4, 9, 9, 1, True, id="k1"),
    pytest.param(1, 2, 8, 4, 5, True, id="k_longer_than_T"),
    pytest.param(3, 1, 8, 6, 3, False, id="T1"),
    pytest.param(2, 17, 41, 41, 5, True, id="T17_C41_k5"),
    pytest.param(2, 33, 40, 70, 3, False, id="multi_tile_rows_and_channels"),
]


def _relative_error(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm().clamp_min(1.0)).item()


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("with_extras", [True, False], ids=["bias_res_scale_mask", "plain"])
@pytest.mark.parametrize("B,T,c_in,c_out,k,causal", CONV_CASES)
@pytest.mark.parametrize("backend", FAST_BACKENDS)
def test_conv_glu_forward_and_backward_match_reference(backend, B, T, c_in, c_out, k, causal, with_extras, dtype):
    x, w, b, res = conv_inputs(B, T, c_in, c_out, k, dtype, requires_grad=True)
    mask = None
    if with_extras:
        mask = torch.zeros(B, T, dtype=torch.bool)
        mask[-1, : T // 2] = True  # left padding of the last row, as the encoder sees it
    kw = dict(causal=causal, residual=res if with_extras else None, scale=math.sqrt(0.5) if with_extras else None,
              pad_mask=mask)
    bias = b if with_extras else None
    runnable(backend, "conv_glu", x, w, bias, **kw)
    out = ck.conv_glu(x, w, bias, backend=backend, **kw)
    ref_inputs = [t.detach().double().requires_grad_() for t in (x, w, b, res)]
    ref_kw = dict(kw, residual=ref_inputs[3] if with_extras else None)
    want = reference.conv_glu_ref(ref_inputs[0], ref_inputs[1], ref_inputs[2] if with_extras else None, **ref_kw)
    assert out.dtype == dtype and not torch.isnan(out).any()
    assert_close("conv_glu", out, want)
    dout = torch.randn_like(want)
    leaves = [x, w] + ([b, res] if with_extras else [])
    grads = torch.autograd.grad(out, leaves, dout.to(dtype))
    want_grads = torch.autograd.grad(want, ref_inputs[:2] + (ref_inputs[2:] if with_extras else []), dout)
    for name, g, wg in zip(["x", "weight", "bias", "residual"], grads, want_grads):
        assert g.dtype == dtype and g.shape == wg.shape
        assert _relative_error(g, wg) < GRAD_RTOL[dtype], f"grad of {name}: relative error {_relative_error(g, wg)}"
    if mask is not None:
        assert torch.all(grads[0][mask] == 0), "padded input steps get no gradient"


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("backend", FAST_BACKENDS)
def test_conv_glu_gradcheck_float64(backend, causal):
    x, w, b, res = conv_inputs(2, 5, 6, 4, 3, torch.float64, requires_grad=True)
    mask = torch.zeros(2, 5, dtype=torch.bool)
    mask[1, :2] = True
    runnable(backend, "conv_glu", x, w, b, causal=causal, residual=res, scale=0.7, pad_mask=mask)
    fn = lambda x, w, b, r: ck.conv_glu(x, w, b, causal=causal, residual=r, scale=0.7, pad_mask=mask,
                                        backend=backend)
    assert torch.autograd.gradcheck(fn, (x, w, b, res))


@pytest.mark.parametrize("backend", FAST_BACKENDS)
def test_conv_glu_strided_input(backend):
    big = torch.randn(2, 6, 20)
    x = big[:, :, 3:15]  # last dim contiguous, rows strided
    _, w, b, res = conv_inputs(2, 6, 12, 5, 3, torch.float32)
    runnable(backend, "conv_glu", x, w, b, causal=True, residual=res, scale=0.5)
    out = ck.conv_glu(x, w, b, causal=True, residual=res, scale=0.5, backend=backend)
    assert_close("conv_glu", out, reference.conv_glu_ref(x, w, b, causal=True, residual=res, scale=0.5))


def test_cpp_conv_glu_traces_under_torch_compile():
    x, w, b, res = conv_inputs(2, 5, 8, 4, 3, torch.float32)
    runnable("cpp", "conv_glu", x, w, b, causal=True, residual=res, scale=0.5)
    fn = lambda x: ck.conv_glu(x, w, b, causal=True, residual=res, scale=0.5, backend="cpp") * 2
    compiled = torch.compile(fn, backend="aot_eager", fullgraph=True)
    torch.testing.assert_close(compiled(x), fn(x))


# --- attention with the embedding sum, forward and backward ----------------------------------
ATTN_CASES = [
    pytest.param(3, 4, 6, 8, True, id="train_left_pad"),
    pytest.param(2, 5, 7, 5, False, id="right_pad_odd_E"),
    pytest.param(6, 1, 9, 16, True, id="decode_one_query"),
    pytest.param(2, 3, 1, 4, True, id="single_source_step"),
    pytest.param(3, 17, 37, 41, True, id="multi_tile_left_pad"),
    pytest.param(3, 17, 37, 41, False, id="multi_tile_right_pad"),
]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("with_lengths", [True, False], ids=["lengths", "no_padding"])
@pytest.mark.parametrize("B,T,S,E,left_pad", ATTN_CASES)
@pytest.mark.parametrize("backend", FAST_BACKENDS)
def test_attention_forward_and_backward_match_reference(backend, B, T, S, E, left_pad, with_lengths, dtype):
    # scores q.z of unit scale whatever E (a learned model's range); larger ones make bf16's own
    # rounding of q and z, not the kernel, dominate the error
    q, z, y = (torch.randn(B, n, E, dtype=torch.float64) for n in (T, S, S))
    q, z, y = ((t * s).to(dtype).requires_grad_() for t, s in ((q, E ** -0.5), (z, 1.0), (y, 1.0)))
    lengths = torch.randint(1, S + 1, (B,)) if with_lengths else None
    if with_lengths:
        lengths[0] = S  # one unpadded row
        lengths[-1] = 1  # and one with a single step: whole source tiles are padding
    runnable(backend, "attention_embsum", q, z, y, lengths)
    ctx, attn = ck.attention_embsum(q, z, y, lengths, left_pad=left_pad, return_attn=True, backend=backend)
    rq, rz, ry = (t.detach().double().requires_grad_() for t in (q, z, y))
    want_ctx, want_attn = reference.attention_embsum_ref(rq, rz, ry, lengths, left_pad=left_pad, return_attn=True)
    assert ctx.dtype == dtype and attn.dtype == dtype
    assert_close("attention_embsum", ctx, want_ctx)
    assert_close("attention_embsum", attn, want_attn, what="attention probabilities")
    if with_lengths:
        pad = reference.source_key_mask(lengths, S, left_pad)
        assert torch.all(attn.transpose(0, 1)[:, pad] == 0), "padded source steps get no attention"
    dctx = torch.randn_like(want_ctx)
    grads = torch.autograd.grad(ctx, (q, z, y), dctx.to(dtype), retain_graph=True)
    want = torch.autograd.grad(want_ctx, (rq, rz, ry), dctx, retain_graph=True)
    for name, g, w in zip("qzy", grads, want):
        assert _relative_error(g, w) < GRAD_RTOL[dtype], f"grad of {name}: relative error {_relative_error(g, w)}"
    # a gradient through the returned probabilities as well (alignment losses use them)
    dattn = torch.randn_like(want_attn)
    grads = torch.autograd.grad((ctx, attn), (q, z, y), (dctx.to(dtype), dattn.to(dtype)))
    want = torch.autograd.grad((want_ctx, want_attn), (rq, rz, ry), (dctx, dattn))
    for name, g, w in zip("qzy", grads, want):
        assert _relative_error(g, w) < GRAD_RTOL[dtype], f"grad of {name}: relative error {_relative_error(g, w)}"


@pytest.mark.parametrize("backend", FAST_BACKENDS)
def test_attention_strided_inputs(backend):
    """Slices of larger buffers (strided rows, offset starts) give the reference's result."""
    B, T, S, E = 3, 4, 6, 8
    q = torch.randn(B, T, 2 * E)[:, :, E:]
    z = torch.randn(B, S + 2, E)[:, 1 : S + 1]
    y = torch.randn(S, B, E).transpose(0, 1)  # batch not the outer dimension
    lengths = torch.tensor([6, 2, 4])
    runnable(backend, "attention_embsum", q, z, y, lengths)
    ctx, attn = ck.attention_embsum(q, z, y, lengths, return_attn=True, backend=backend)
    want_ctx, want_attn = reference.attention_embsum_ref(q, z, y, lengths, return_attn=True)
    assert_close("attention_embsum", ctx, want_ctx)
    assert_close("attention_embsum", attn, want_attn, what="attention probabilities")


@pytest.mark.parametrize("backend", FAST_BACKENDS)
def test_attention_gradcheck_float64(backend):
    q, z, y = (torch.randn(2, n, 5, dtype=torch.float64, requires_grad=True) for n in (3, 4, 4))
    lengths = torch.tensor([4, 2])
    runnable(backend, "attention_embsum", q, z, y, lengths)
    assert torch.autograd.gradcheck(lambda q, z, y: ck.attention_embsum(q, z, y, lengths, backend=backend), (q, z, y))


def test_cpp_attention_traces_under_torch_compile():
    q, z, y = (torch.randn(2, n, 8) for n in (3, 5, 5))
    lengths = torch.tensor([5, 3])
    runnable("cpp", "attention_embsum", q, z, y, lengths)
    fn = lambda q: ck.attention_embsum(q, z, y, lengths, backend="cpp") + 1
    torch.testing.assert_close(torch.compile(fn, backend="aot_eager", fullgraph=True)(q), fn(q))


# --- the decoding step's few-row linear ------------------------------------------------------
@pytest.mark.parametrize("rows", [1, 2, 5, 8])
@pytest.mark.parametrize("backend", ["cpp"])  # Triton has no linear: on GPUs it is a cuBLAS GEMM
@torch.no_grad()
def test_linear_matches_reference(backend, rows):
    x, w, b = torch.randn(rows, 96), torch.randn(200, 96) / 10, torch.randn(200)
    runnable(backend, "linear", x, w, b)
    assert_close("linear", ck.linear(x, w, b, backend=backend), torch.nn.functional.linear(x, w, b))


def test_linear_falls_back_where_the_cpp_kernel_does_not_apply():
    w = torch.randn(7, 5, requires_grad=True)
    assert dispatch.reasons("cpp", "linear", torch.device("cpu"), torch.randn(9, 5), w.detach())  # too many rows
    assert dispatch.reasons("cpp", "linear", torch.device("cpu"), torch.randn(3, 5), w)  # needs a gradient
    out = ck.linear(torch.randn(3, 5), w, backend="cpp,reference")  # falls back, keeps autograd
    out.sum().backward()
    assert w.grad is not None


# --- weight-only int8 linear (decoding) --------------------------------------------------------
@pytest.mark.parametrize("rows", [1, 2, 5, 8, 13])  # 13: more than the few-row kernel takes
@pytest.mark.parametrize("K,N", [(96, 200), (1536, 64), (33, 7)])
@torch.no_grad()
def test_linear_int8_matches_reference(rows, K, N):
    x, w, b = torch.randn(rows, K), torch.randn(N, K) / K ** 0.5, torch.randn(N)
    q, s = ck.quantize_int8(w)
    runnable("cpp", "linear_int8", x, q, s, b)
    out = ck.linear_int8(x, q, s, b, backend="cpp")
    assert_close("linear_int8", out, reference.linear_int8_ref(x.double(), q, s.double(), b.double()))
    # a strided x (every other column of a wider buffer)
    wide = torch.randn(rows, 2 * K)
    out = ck.linear_int8(wide[:, ::2], q, s, b, backend="cpp")
    assert_close("linear_int8", out, reference.linear_int8_ref(wide[:, ::2].double(), q, s.double(), b.double()))
    # without a bias, and with leading dims
    out = ck.linear_int8(x.view(1, rows, K), q, s, backend="cpp")
    assert out.shape == (1, rows, N)
    assert_close("linear_int8", out[0], reference.linear_int8_ref(x.double(), q, s.double()))


def test_quantize_int8_bounds_the_error_per_row():
    w = torch.randn(50, 70) * torch.logspace(-3, 1, 50).unsqueeze(1)  # rows of very different scales
    w[3] = 0  # a zero row must not divide by zero
    q, s = ck.quantize_int8(w)
    assert q.dtype == torch.int8 and q.is_contiguous() and s.shape == (50,)
    assert int(q.abs().max()) == 127 and torch.all(q[3] == 0)
    err = (q.float() * s.unsqueeze(1) - w).abs()
    assert torch.all(err <= s.unsqueeze(1) / 2 + 1e-12)
    # a transposed (non-contiguous) weight quantises to contiguous rows
    qt, _ = ck.quantize_int8(w.t().contiguous().t())
    assert qt.is_contiguous() and torch.equal(qt, q)


def test_linear_int8_errors_name_the_problem():
    x = torch.randn(2, 8)
    q, s = ck.quantize_int8(torch.randn(4, 8))
    with pytest.raises(TypeError, match="qweight must be int8"):
        ck.linear_int8(x, q.float(), s)
    with pytest.raises(ValueError, match="qweight expects 8 input features but x has 5"):
        ck.linear_int8(torch.randn(2, 5), q, s)
    with pytest.raises(ValueError, match="scale must have shape"):
        ck.linear_int8(x, q, s[:3])
