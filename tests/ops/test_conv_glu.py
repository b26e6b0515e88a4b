"""``conv_glu``: every backend against the reference (forward, backward, gradcheck, strided inputs,
torch.compile), the reference against an explicit tap loop, the paper's shapes on GPUs, autocast,
and the input errors."""

import math
import os
import subprocess
import sys

import pytest
import torch

import convs2s_kernels as ck
from convs2s_kernels.testing import assert_close
from harness import DTYPES, FAST_BACKENDS, assert_grads_close, conv_inputs, conv_weight, require_or_skip, runnable

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
    want = ck.conv_glu_ref(ref_inputs[0], ref_inputs[1], ref_inputs[2] if with_extras else None, **ref_kw)
    assert out.dtype == dtype and not torch.isnan(out).any()
    assert_close("conv_glu", out, want)
    dout = torch.randn_like(want)
    leaves = [x, w] + ([b, res] if with_extras else [])
    grads = torch.autograd.grad(out, leaves, dout.to(dtype))
    want_grads = torch.autograd.grad(want, ref_inputs[:2] + (ref_inputs[2:] if with_extras else []), dout)
    assert_grads_close(grads, want_grads, ["x", "weight", "bias", "residual"], dtype)
    if mask is not None:
        assert torch.all(grads[0][mask] == 0), "padded input steps get no gradient"


@pytest.mark.parametrize("splits", [1, 2, 7])
def test_triton_weight_gradient_in_row_chunks_matches_reference(splits):
    """The weight gradient at once (in the input dtype) and in row chunks of partials (where a
    GPU's tiles are too few): M = 310 rows at once, in 2 chunks of 155 (several row tiles each,
    the second starting inside a tile's worth of rows) or 7 of 45 (the last short), chunks ending
    inside a sentence, with left padding; float64."""
    require_or_skip("triton")
    from convs2s_kernels.ops.conv_glu.triton_kernels import conv_glu_backward, conv_glu_forward

    B, T, c_in, c_out, k = 10, 31, 12, 10, 3
    x, w, b, _ = conv_inputs(B, T, c_in, c_out, k, torch.float64)
    mask = torch.zeros(B, T, dtype=torch.bool)
    mask[-1, :3] = True
    _, pre = conv_glu_forward(x, w, b, None, mask, False, 0.5, save_pre=True)
    dout = torch.randn(B, T, c_out, dtype=torch.float64)
    dx, dw, db, _ = conv_glu_backward(dout, pre, x, w, mask, False, 0.5, (True, True, True, False), dw_splits=splits)
    leaves = [t.detach().clone().requires_grad_() for t in (x, w, b)]
    want = ck.conv_glu_ref(*leaves, causal=False, scale=0.5, pad_mask=mask)
    want_dx, want_dw, want_db = torch.autograd.grad(want, leaves, dout)
    for name, got, ref in (("dx", dx, want_dx), ("dweight", dw, want_dw), ("dbias", db, want_db)):
        assert got.dtype == torch.float64 and got.shape == ref.shape, name
        torch.testing.assert_close(got, ref, rtol=1e-10, atol=1e-10, msg=name)


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "centred"])
@pytest.mark.parametrize("backend", ["cpp", "reference"])
@torch.no_grad()
def test_conv_glu_with_the_packed_weight_matches_reference(backend, causal):
    """``packed=pack_conv_step_weight(weight)`` (translating): the cpp kernel reads it where the
    kernel choice gives it the rows, in 64-row pieces past its cap (the profiler sees the packed
    kernel), the GEMM on the weight where not, the reference ignores it; odd channels, even and odd
    widths, left padding, residual and scale, float64 reference."""
    from convs2s_kernels import tune

    require_or_skip("cpp")  # the packing itself is the extension's
    packed_calls = lambda prof: sum(e.name == "convs2s::few_rows_kn_packed" for e in prof.events())
    try:
        for B, T, c_in, c_out, k in ((2, 7, 13, 7, 3), (3, 30, 40, 33, 4), (1, 5, 9, 9, 1)):
            x, w, b, res = conv_inputs(B, T, c_in, c_out, k, torch.float32)
            packed = ck.pack_conv_step_weight(w)
            mask = torch.zeros(B, T, dtype=torch.bool)
            mask[-1, : T // 3] = True
            kw = dict(causal=causal, residual=res, scale=math.sqrt(0.5), pad_mask=mask)
            want = ck.conv_glu_ref(x.double(), w.double(), b.double(), **dict(kw, residual=res.double()))
            for on_kernel in (True, False):
                if backend == "cpp":
                    native = ck.extension.native()
                    native.set_few_rows_choice(tune.FORMS["kp"], "float32", k * c_in, 2 * c_out,
                                               [on_kernel] * native.few_rows_max())
                with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
                    got = ck.conv_glu(x, w, b, packed=packed, backend=backend, **kw)
                assert packed_calls(prof) == (-(-B * T // 64) if on_kernel and backend == "cpp" else 0)
                assert_close("conv_glu", got, want)
        with pytest.raises(ValueError, match="packed is not pack_conv_step_weight"):
            ck.conv_glu(x, w + 1, b, packed=packed, backend=backend, causal=causal)
    finally:
        tune.forget()


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
    assert_close("conv_glu", out, ck.conv_glu_ref(x, w, b, causal=True, residual=res, scale=0.5))


def test_cpp_conv_glu_traces_under_torch_compile():
    x, w, b, res = conv_inputs(2, 5, 8, 4, 3, torch.float32)
    runnable("cpp", "conv_glu", x, w, b, causal=True, residual=res, scale=0.5)
    fn = lambda x: ck.conv_glu(x, w, b, causal=True, residual=res, scale=0.5, backend="cpp") * 2
    compiled = torch.compile(fn, backend="aot_eager", fullgraph=True)
    torch.testing.assert_close(compiled(x), fn(x))


@pytest.mark.parametrize("winograd", [0, 4])
def test_cpp_conv_glu_gradients_under_torch_compile_equal_eager(monkeypatch, winograd):
    """Compiled, the custom op and its autograd formula run; eager, a plain autograd.Function: the same kernels."""
    from convs2s_kernels.ops.conv_glu import cpp as conv_cpp

    torch._dynamo.reset()  # a graph compiled for the other tile is not reused
    monkeypatch.setattr(conv_cpp, "WINOGRAD_MIN_ROWS", 0)
    monkeypatch.setenv("CONVS2S_CONV_WINOGRAD", str(winograd))
    x, w, b, res = (t.requires_grad_() for t in conv_inputs(2, 5, 8, 4, 3, torch.float32))
    runnable("cpp", "conv_glu", x, w, b, causal=True, residual=res, scale=0.5)
    fn = lambda x, w, b, res: ck.conv_glu(x, w, b, causal=True, residual=res, scale=0.5, backend="cpp")
    compiled = torch.compile(fn, backend="aot_eager", fullgraph=True)
    got = torch.autograd.grad((compiled(x, w, b, res) ** 2).sum(), (x, w, b, res))
    want = torch.autograd.grad((fn(x, w, b, res) ** 2).sum(), (x, w, b, res))
    for g, v in zip(got, want):
        torch.testing.assert_close(g, v)


# --- Winograd F(m, 3): the cpp backend's convolutions in training ------------------------------
# (5, 29, ...): 40-75 tiles, several of the transforms' 8-tile parallel grains
WINOGRAD_CASES = [(2, 7, 16, 8), (3, 1, 8, 6), (2, 3, 13, 7), (3, 9, 40, 33), (1, 13, 9, 5), (2, 4, 6, 4), (5, 29, 11, 6)]


@pytest.mark.parametrize("tile", [2, 4])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "centred"])
def test_cpp_conv_glu_winograd_matches_reference(tile, dtype, causal, monkeypatch):
    """F(2, 3) and F(4, 3) forward and backward against the float64 reference: T below, at and past
    a tile (1, 3, 4, 7, 9, 13 steps: partial last tiles), odd channels, left padding, residual and
    scale; the batched products (aten::bmm) run forward and backward, and not without gradients."""
    from convs2s_kernels.ops.conv_glu import cpp as conv_cpp

    require_or_skip("cpp")
    monkeypatch.setattr(conv_cpp, "WINOGRAD_MIN_ROWS", 0)
    monkeypatch.setenv("CONVS2S_CONV_WINOGRAD", str(tile))
    bmm_calls = lambda prof: sum(e.name == "aten::bmm" for e in prof.events())
    for B, T, c_in, c_out in WINOGRAD_CASES:
        x, w, b, res = conv_inputs(B, T, c_in, c_out, 3, dtype, requires_grad=True)
        mask = torch.zeros(B, T, dtype=torch.bool)
        mask[-1, : T // 2] = True
        kw = dict(causal=causal, residual=res, scale=math.sqrt(0.5), pad_mask=mask)
        assert conv_cpp.winograd_tile(x, w) == tile
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof, \
                ck.count_dispatches() as counts:
            out = ck.conv_glu(x, w, b, backend="cpp", **kw)
            dout = torch.randn_like(out)
            grads = torch.autograd.grad(out, (x, w, b, res), dout)
        assert bmm_calls(prof) == 3, "one batched product forward, two backward"
        assert counts == {("conv_glu", f"cpp, winograd F({tile},3)"): 1}, "the row names the algorithm"
        leaves = [t.detach().double().requires_grad_() for t in (x, w, b, res)]
        want = ck.conv_glu_ref(*leaves[:3], **dict(kw, residual=leaves[3]))
        assert_close("conv_glu", out, want)
        assert_grads_close(grads, torch.autograd.grad(want, leaves, dout.double()),
                           ["x", "weight", "bias", "residual"], dtype)
        assert torch.all(grads[0][mask] == 0), "padded input steps get no gradient"
        with torch.no_grad(), torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            assert_close("conv_glu", ck.conv_glu(x, w, b, backend="cpp", **kw), want)
        assert bmm_calls(prof) == 0, "without gradients the convolution keeps im2col"


@pytest.mark.parametrize("tile", [2, 4])
def test_cpp_conv_glu_winograd_without_residual_or_bias(tile, monkeypatch):
    """The decoder's attention layers: no residual (no residual gradient made), and no bias."""
    from convs2s_kernels.ops.conv_glu import cpp as conv_cpp

    require_or_skip("cpp")
    monkeypatch.setattr(conv_cpp, "WINOGRAD_MIN_ROWS", 0)
    monkeypatch.setenv("CONVS2S_CONV_WINOGRAD", str(tile))
    for B, T, c_in, c_out in WINOGRAD_CASES[:4]:
        x, w, b, _ = conv_inputs(B, T, c_in, c_out, 3, torch.float64, requires_grad=True)
        for bias in (b, None):
            leaves = (x, w) + ((b,) if bias is not None else ())
            out = ck.conv_glu(x, w, bias, causal=True, backend="cpp")
            dout = torch.randn_like(out)
            grads = torch.autograd.grad(out, leaves, dout)
            ref = [t.detach().clone().requires_grad_() for t in leaves]
            want = ck.conv_glu_ref(ref[0], ref[1], ref[2] if bias is not None else None, causal=True)
            assert_close("conv_glu", out, want)
            assert_grads_close(grads, torch.autograd.grad(want, ref, dout), ["x", "weight", "bias"][:len(leaves)],
                               torch.float64)


def test_cpp_conv_glu_winograd_gradcheck_and_choice(monkeypatch):
    from convs2s_kernels.ops.conv_glu import cpp as conv_cpp

    require_or_skip("cpp")
    x, w, b, res = conv_inputs(2, 6, 5, 3, 3, torch.float64, requires_grad=True)
    assert conv_cpp.winograd_tile(x, w) == 0, "12 rows: below WINOGRAD_MIN_ROWS"
    big = torch.randn(4, conv_cpp.WINOGRAD_MIN_ROWS // 4, 5, dtype=torch.float64, requires_grad=True)
    assert conv_cpp.winograd_tile(big, w) == conv_cpp.WINOGRAD_TILE
    assert conv_cpp.winograd_tile(big.detach().float(), w.detach().float()) == 0, "no gradient wanted"
    assert conv_cpp.winograd_tile(big.bfloat16(), w.bfloat16()) == 0, "float32 and float64 only"
    assert conv_cpp.winograd_tile(big, torch.randn(4, 5, 6, dtype=torch.float64)) == 0, "k = 3 only"
    monkeypatch.setattr(conv_cpp, "WINOGRAD_MIN_ROWS", 0)
    for tile in (2, 4):
        monkeypatch.setenv("CONVS2S_CONV_WINOGRAD", str(tile))
        fn = lambda x, w, b, r: ck.conv_glu(x, w, b, causal=False, residual=r, scale=0.7, backend="cpp")
        assert torch.autograd.gradcheck(fn, (x, w, b, res))
    monkeypatch.setenv("CONVS2S_CONV_WINOGRAD", "3")
    with pytest.raises(ValueError, match="CONVS2S_CONV_WINOGRAD must be 0, 2 or 4"):
        ck.conv_glu(x, w, b, causal=True, backend="cpp")


# --- the reference against an independent formulation ------------------------------------------
def naive_conv_glu(x, weight, bias, causal, residual=None, scale=None, pad_mask=None):
    """Sum over taps with explicit zero padding: out[t] = sum_j x[t + j - left] @ W[j]."""
    B, T, _ = x.shape
    k, _, c2 = weight.shape
    if pad_mask is not None:
        x = x * (~pad_mask).unsqueeze(-1).to(x.dtype)
    left = k - 1 if causal else (k - 1) // 2
    pre = torch.zeros(B, T, c2, dtype=x.dtype)
    for t in range(T):
        for j in range(k):
            src = t + j - left
            if 0 <= src < T:
                pre[:, t] += x[:, src] @ weight[j]
    if bias is not None:
        pre += bias
    c = c2 // 2
    out = pre[..., :c] * torch.sigmoid(pre[..., c:])
    if residual is not None:
        out = out + residual
    if scale is not None:
        out = out * scale
    return out


CONV_SHAPES = [
    pytest.param(2, 7, 8, 8, 3, id="B2_T7_C8_k3"),
    pytest.param(1, 1, 5, 3, 3, id="T1_k3"),
    pytest.param(3, 2, 6, 4, 5, id="k5_gt_T2"),
    pytest.param(2, 9, 41, 13, 4, id="even_k4_odd_C41"),
    pytest.param(2, 6, 16, 8, 1, id="k1"),
    pytest.param(2, 5, 7, 9, 2, id="k2"),
]


# The cpp GLU's float32 sigmoid (csrc/glu_cpu.cpp: a polynomial exp on whole vectors) on a sweep of
# gates and at the limits, through a 1 x 1 convolution that passes [1, gate] through exactly; at
# every vector width the kernels are built for (16, 8 and 4 lanes), each in its own process since
# the instruction set is read once.
_SIGMOID_CODE = """
import math, torch, convs2s_kernels as ck
def sigmoid_cpp(g):
    n = g.numel()
    x = torch.stack([torch.ones(n), g], -1).view(1, n, 2)
    w = torch.zeros(1, 2, 2); w[0, 0, 0] = 1; w[0, 1, 1] = 1
    return ck.conv_glu(x, w, torch.zeros(2), causal=True, backend="cpp").view(-1)
g = torch.linspace(-87, 88, 200_003)  # not a whole number of vectors: the tail too
got, want = sigmoid_cpp(g).double(), torch.sigmoid(g.double())
ulp = (torch.nextafter(want.float(), torch.tensor(math.inf)) - want.float()).double()
worst = ((got - want).abs() / ulp).max().item()
assert worst <= 3, f"sigmoid {worst:.2f} ulp from float64's"
edges = torch.tensor([-1e30, -200., -88.5, 87.5, 88.5, 200., 1e30, math.inf, -math.inf, math.nan])
out = sigmoid_cpp(edges)
assert out[:3].eq(0).all() and out[3:7].eq(1).all(), out
assert out[7:].isnan().all(), "an inf gate times the zero weights is NaN, and NaN stays NaN"
# bf16 rows (autocast's): widened, the same float32 span, rounded back to nearest even; within a
# bf16 rounding of float64's sigmoid, and the backward's derivative likewise
gb = torch.linspace(-30, 30, 100_003).bfloat16()
xb = torch.stack([torch.ones_like(gb), gb], -1).view(1, -1, 2).requires_grad_()
wb = torch.zeros(1, 2, 2, dtype=torch.bfloat16); wb[0, 0, 0] = 1; wb[0, 1, 1] = 1
outb = ck.conv_glu(xb, wb, torch.zeros(2, dtype=torch.bfloat16), causal=True, backend="cpp").view(-1)
sig = torch.sigmoid(gb.double())
assert outb.dtype == torch.bfloat16 and ((outb.double() - sig).abs() <= 2 ** -8 * sig + 1e-40).all()
(dx,) = torch.autograd.grad(outb.sum(), xb)
s32 = torch.sigmoid(gb.float())
dgate = (s32 * (1 - s32)).double()  # d out / d gate with value 1, as float32 forms it (1 - s cancels near 1)
assert ((dx[0, :, 1].double() - dgate).abs() <= 2 ** -8 * dgate + 1e-6).all()
"""


@pytest.mark.parametrize("cap", ["native", "avx2", "baseline"])
def test_cpp_glu_sigmoid_within_3_ulp_and_exact_at_the_limits(cap):
    require_or_skip("cpp")
    env = dict(os.environ)
    env.pop("CONVS2S_KERNELS_ISA", None)
    if cap != "native":
        env["CONVS2S_KERNELS_ISA"] = cap
    out = subprocess.run([sys.executable, "-c", _SIGMOID_CODE], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "centred"])
@pytest.mark.parametrize("B,T,c_in,c_out,k", CONV_SHAPES)
def test_conv_glu_ref_matches_tap_loop(B, T, c_in, c_out, k, causal):
    x = torch.randn(B, T, c_in, dtype=torch.float64)
    w, b = conv_weight(k, c_in, c_out, torch.float64)
    residual = torch.randn(B, T, c_out, dtype=torch.float64)
    pad_mask = torch.zeros(B, T, dtype=torch.bool)
    pad_mask[0, : T // 2] = True  # left padding on the first row
    for kw in (dict(), dict(residual=residual, scale=math.sqrt(0.5)), dict(pad_mask=pad_mask)):
        got = ck.conv_glu_ref(x, w, b, causal=causal, **kw)
        want = naive_conv_glu(x, w, b, causal, **kw)
        torch.testing.assert_close(got, want, atol=1e-12, rtol=1e-10)


def test_conv_padding_rule():
    assert ck.reference.conv_padding(3, causal=True) == (2, 0)
    assert ck.reference.conv_padding(3, causal=False) == (1, 1)
    assert ck.reference.conv_padding(4, causal=False) == (1, 2)  # fairseq's even-k rule
    assert ck.reference.conv_padding(1, causal=False) == (0, 0)


def test_conv_glu_ref_is_causal():
    x = torch.randn(1, 8, 4, dtype=torch.float64)
    w, b = conv_weight(3, 4, 4, torch.float64)
    base = ck.conv_glu_ref(x, w, b, causal=True)
    x2 = x.clone()
    x2[:, 5:] += 1.0
    out2 = ck.conv_glu_ref(x2, w, b, causal=True)
    torch.testing.assert_close(out2[:, :5], base[:, :5], atol=0, rtol=0)
    assert not torch.allclose(out2[:, 5:], base[:, 5:])


def test_conv_glu_ref_gradcheck():
    x, w, b, res = conv_inputs(2, 4, 3, 2, 3, torch.float64, requires_grad=True)
    fn = lambda x, w, b, r: ck.conv_glu_ref(x, w, b, causal=True, residual=r, scale=0.7)
    assert torch.autograd.gradcheck(fn, (x, w, b, res))


def test_conv_glu_follows_autocast_like_pytorch_layers():
    """Under bf16 autocast the op casts its inputs as F.conv1d would (mixed fp32 weights and
    bf16 activations), and still matches the reference on the cast inputs."""
    torch.manual_seed(0)
    x = torch.randn(2, 5, 8)
    w = torch.randn(3, 8, 12) / 5
    b = torch.randn(12)
    res = torch.randn(2, 5, 6)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = ck.conv_glu(x.bfloat16(), w, b, causal=True, residual=res, scale=0.5, backend="reference")
        ctx = ck.attention_embsum(torch.randn(2, 3, 8).bfloat16(), x, x, torch.tensor([5, 3]), backend="reference")
    assert out.dtype == torch.bfloat16 and ctx.dtype == torch.bfloat16
    want = ck.conv_glu_ref(x.bfloat16(), w.bfloat16(), b.bfloat16(), causal=True, residual=res.bfloat16(), scale=0.5)
    torch.testing.assert_close(out, want, rtol=0, atol=0)


# --- GPUs: bf16 and the paper's large shapes at the autotuned block sizes ----------------------
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("B,T,C,k,causal", [(160, 25, 512, 3, True), (160, 25, 768, 3, False),
                                           (160, 25, 2048, 1, True), (4, 1000, 256, 5, True)])
def test_conv_glu_paper_shapes_on_gpu(B, T, C, k, causal, dtype):
    dev = "cuda"
    x = torch.randn(B, T, C, device=dev, dtype=dtype, requires_grad=True)
    w, b = (t.requires_grad_() for t in conv_weight(k, C, C, dtype, dev))
    res = torch.randn(B, T, C, device=dev, dtype=dtype, requires_grad=True)
    mask = torch.zeros(B, T, dtype=torch.bool, device=dev)
    mask[::3, : T // 3] = True
    kw = dict(causal=causal, residual=res, scale=math.sqrt(0.5), pad_mask=None if causal else mask)
    out = ck.conv_glu(x, w, b, backend="triton", **kw)
    ref_in = [t.detach().double().requires_grad_() for t in (x, w, b, res)]
    want = ck.conv_glu_ref(ref_in[0], ref_in[1], ref_in[2], **dict(kw, residual=ref_in[3]))
    assert_close("conv_glu", out, want)
    dout = torch.randn_like(want)
    grads = torch.autograd.grad(out, (x, w, b, res), dout.to(dtype))
    want_grads = torch.autograd.grad(want, ref_in, dout)
    assert_grads_close(grads, want_grads, ["x", "weight", "bias", "residual"], dtype)


# --- input errors -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "call,match",
    [
        (lambda: ck.conv_glu(torch.randn(3, 4), torch.randn(3, 4, 6), causal=True), "x must have 3 dimensions"),
        (lambda: ck.conv_glu(torch.randn(1, 3, 5), torch.randn(3, 4, 6), causal=True), "C_in = 4"),
        (lambda: ck.conv_glu(torch.randn(1, 3, 4), torch.randn(3, 4, 5), causal=True), "even last dimension"),
        (lambda: ck.conv_glu(torch.randn(1, 3, 4).double(), torch.randn(3, 4, 6), causal=True), "dtype"),
        (lambda: ck.conv_glu(torch.randint(0, 3, (1, 3, 4)), torch.randn(3, 4, 6), causal=True), "floating-point"),
        (lambda: ck.conv_glu(torch.randn(1, 3, 4), torch.randn(3, 4, 6), causal=True,
                             pad_mask=torch.zeros(1, 3)), "bool"),
        (lambda: ck.conv_glu(torch.randn(1, 3, 4), torch.randn(3, 4, 6), causal=True,
                             residual=torch.randn(1, 3, 4)), "residual must have shape"),
    ],
)
def test_conv_glu_bad_inputs_name_the_problem(call, match):
    with pytest.raises((ValueError, TypeError), match=match):
        call()
