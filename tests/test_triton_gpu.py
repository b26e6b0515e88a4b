"""The Triton kernels compiled for a GPU: bf16, and the paper's large shapes (skipped without CUDA).

The interpreter tests (test_backends.py, test_triton_model.py) prove the kernels' logic on the
CPU in fp64/fp32/fp16; these run what the interpreter cannot: bf16 arithmetic, real tiling at
the autotuned block sizes, and shapes too large to interpret.
"""

import math

import pytest
import torch

import convs2s_kernels as ck
from convs2s_kernels import reference
from convs2s_kernels.testing import assert_close

pytestmark = pytest.mark.gpu

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
GRAD_RTOL = {torch.float32: 1e-4, torch.float16: 4e-3, torch.bfloat16: 3e-2}


def _rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm().clamp_min(1.0)).item()


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("B,T,C,k,causal", [(160, 25, 512, 3, True), (160, 25, 768, 3, False),
                                           (160, 25, 2048, 1, True), (4, 1000, 256, 5, True)])
def test_conv_glu_paper_shapes(B, T, C, k, causal, dtype):
    dev = "cuda"
    x = torch.randn(B, T, C, device=dev, dtype=dtype, requires_grad=True)
    w = (torch.randn(k, C, 2 * C, device=dev) / math.sqrt(k * C)).to(dtype).requires_grad_()
    b = (0.1 * torch.randn(2 * C, device=dev)).to(dtype).requires_grad_()
    res = torch.randn(B, T, C, device=dev, dtype=dtype, requires_grad=True)
    mask = torch.zeros(B, T, dtype=torch.bool, device=dev)
    mask[::3, : T // 3] = True
    kw = dict(causal=causal, residual=res, scale=math.sqrt(0.5), pad_mask=None if causal else mask)
    out = ck.conv_glu(x, w, b, backend="triton", **kw)
    ref_in = [t.detach().double().requires_grad_() for t in (x, w, b, res)]
    want = reference.conv_glu_ref(ref_in[0], ref_in[1], ref_in[2], **dict(kw, residual=ref_in[3]))
    assert_close("conv_glu", out, want)
    dout = torch.randn_like(want)
    grads = torch.autograd.grad(out, (x, w, b, res), dout.to(dtype))
    want_grads = torch.autograd.grad(want, ref_in, dout)
    for name, g, wg in zip(["x", "weight", "bias", "residual"], grads, want_grads):
        assert _rel(g, wg) < GRAD_RTOL[dtype], f"grad of {name}: {_rel(g, wg)}"


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("B,T,S,E", [(160, 25, 25, 768), (160, 1, 25, 512), (8, 200, 300, 256)])
def test_attention_paper_shapes(B, T, S, E, dtype):
    dev = "cuda"
    q = (torch.randn(B, T, E, device=dev) * E ** -0.5).to(dtype).requires_grad_()
    z, y = (torch.randn(B, S, E, device=dev, dtype=dtype, requires_grad=True) for _ in range(2))
    lengths = torch.randint(1, S + 1, (B,), device=dev)
    ctx, attn = ck.attention_embsum(q, z, y, lengths, return_attn=True, backend="triton")
    rq, rz, ry = (t.detach().double().requires_grad_() for t in (q, z, y))
    want_ctx, want_attn = reference.attention_embsum_ref(rq, rz, ry, lengths, return_attn=True)
    assert_close("attention_embsum", ctx, want_ctx)
    assert_close("attention_embsum", attn, want_attn, what="attention probabilities")
    dctx = torch.randn_like(want_ctx)
    grads = torch.autograd.grad(ctx, (q, z, y), dctx.to(dtype))
    want = torch.autograd.grad(want_ctx, (rq, rz, ry), dctx)
    for name, g, wg in zip("qzy", grads, want):
        assert _rel(g, wg) < GRAD_RTOL[dtype], f"grad of {name}: {_rel(g, wg)}"


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("N,C", [(1, 512), (5, 512), (160, 1024)])
@torch.no_grad()
def test_conv_step_paper_shapes(N, C, dtype):
    dev, k = "cuda", 3
    x_t = torch.randn(N, C, device=dev, dtype=dtype)
    state = torch.randn(N, k - 1, C, device=dev, dtype=dtype)
    w = (torch.randn(k, C, 2 * C, device=dev) / math.sqrt(k * C)).to(dtype)
    b = (0.1 * torch.randn(2 * C, device=dev)).to(dtype)
    parents = torch.randint(0, N, (N,), device=dev)
    out, new_state = ck.conv_step(x_t, state, w, b, parents, backend="triton")
    want_out, want_state = reference.conv_step_ref(x_t.double(), state.double(), w.double(), b.double(), parents)
    assert_close("conv_step", out, want_out)
    assert torch.equal(new_state, want_state.to(dtype))
