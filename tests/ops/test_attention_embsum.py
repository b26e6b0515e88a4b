"""``attention_embsum``: every backend against the reference (forward, backward, gradcheck, strided
inputs, torch.compile), the reference against an explicit loop, the paper's shapes on GPUs, and
the input errors."""

import math

import pytest
import torch

import convs2s_kernels as ck
from convs2s_kernels.testing import assert_close
from harness import DTYPES, FAST_BACKENDS, assert_grads_close, require_or_skip, runnable

ATTN_CASES = [
    pytest.param(3, 4, 6, 8, True, id="train_left_pad"),
    pytest.param(2, 5, 7, 5, False, id="right_pad_odd_E"),
    pytest.param(6, 1, 9, 16, True, id="decode_one_query"),
    pytest.param(2, 3, 1, 4, True, id="single_source_step"),
    pytest.param(3, 17, 37, 41, True, id="multi_tile_left_pad"),
    pytest.param(3, 17, 37, 41, False, id="multi_tile_right_pad"),
    pytest.param(2, 5, 7, 100, True, id="embedding_past_one_chunk"),
    # past the one-launch backward's tile (Triton: 32, or 64 on tensor cores): the tiled dS kernel
    # and the batched products
    pytest.param(2, 66, 9, 12, True, id="long_target_unfused"),
    pytest.param(2, 5, 70, 12, False, id="long_source_unfused"),
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
    want_ctx, want_attn = ck.attention_embsum_ref(rq, rz, ry, lengths, left_pad=left_pad, return_attn=True)
    assert ctx.dtype == dtype and attn.dtype == dtype
    assert_close("attention_embsum", ctx, want_ctx)
    assert_close("attention_embsum", attn, want_attn, what="attention probabilities")
    if with_lengths:
        pad = ck.reference.source_key_mask(lengths, S, left_pad)
        assert torch.all(attn.transpose(0, 1)[:, pad] == 0), "padded source steps get no attention"
    dctx = torch.randn_like(want_ctx)
    grads = torch.autograd.grad(ctx, (q, z, y), dctx.to(dtype), retain_graph=True)
    want = torch.autograd.grad(want_ctx, (rq, rz, ry), dctx, retain_graph=True)
    assert_grads_close(grads, want, "qzy", dtype)
    # a gradient through the returned probabilities as well (alignment losses use them)
    dattn = torch.randn_like(want_attn)
    grads = torch.autograd.grad((ctx, attn), (q, z, y), (dctx.to(dtype), dattn.to(dtype)), retain_graph=True)
    want = torch.autograd.grad((want_ctx, want_attn), (rq, rz, ry), (dctx, dattn), retain_graph=True)
    assert_grads_close(grads, want, "qzy", dtype)
    # and through the probabilities alone (no gradient reaches the context; they do not depend on y)
    grads = torch.autograd.grad(attn, (q, z), dattn.to(dtype))
    want = torch.autograd.grad(want_attn, (rq, rz), dattn)
    assert_grads_close(grads, want, "qz", dtype)


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
    want_ctx, want_attn = ck.attention_embsum_ref(q, z, y, lengths, return_attn=True)
    assert_close("attention_embsum", ctx, want_ctx)
    assert_close("attention_embsum", attn, want_attn, what="attention probabilities")
    # gradients through the strided views, with a strided output gradient, float64
    bases = [torch.randn(B, T, 2 * E, dtype=torch.float64), torch.randn(B, S + 2, E, dtype=torch.float64),
             torch.randn(S, B, E, dtype=torch.float64)]
    dctx = torch.randn(T, B, E, dtype=torch.float64).transpose(0, 1)
    grads = []
    for fn in (lambda *a: ck.attention_embsum(*a, lengths, backend=backend), lambda *a: ck.attention_embsum_ref(*a, lengths)):
        leaves = [b.clone().requires_grad_() for b in bases]
        out = fn(leaves[0][:, :, E:], leaves[1][:, 1 : S + 1], leaves[2].transpose(0, 1))
        grads.append(torch.autograd.grad(out, leaves, dctx))
    for name, got, want in zip("qzy", *grads):
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-9, msg=name)


def test_triton_backward_is_one_launch_where_the_sentence_fits_its_tile():
    """The fused backward where queries and sources fit (32 each with IEEE fp32 products), the
    tiled one past it; only the probabilities used (no context gradient) works too."""
    import importlib

    require_or_skip("triton")
    kernels = importlib.import_module("convs2s_kernels.ops.attention_embsum.triton_kernels")
    launched = []
    for name in ("_attention_bwd_fused_kernel", "_attention_bwd_ds_kernel"):
        tuner = getattr(kernels, name)
        run = tuner.run
        tuner.run = lambda *a, _run=run, _name=name, **k: (launched.append(_name), _run(*a, **k))[1]
    try:
        for T, S, want in ((5, 7, "fused"), (32, 32, "fused"), (33, 4, "ds"), (4, 40, "ds")):
            q, z, y = (torch.randn(2, n, 8, dtype=torch.float64, requires_grad=True) for n in (T, S, S))
            launched.clear()
            ctx, attn = ck.attention_embsum(q, z, y, return_attn=True, backend="triton")
            grads = torch.autograd.grad(attn.sum() * 0.5, (q, z))  # the context unused: its gradient None
            assert launched == [f"_attention_bwd_{want}_kernel"], (T, S, launched)
            rq, rz, ry = (t.detach().requires_grad_() for t in (q, z, y))
            want_grads = torch.autograd.grad(ck.attention_embsum_ref(rq, rz, ry, return_attn=True)[1].sum() * 0.5,
                                             (rq, rz))
            for got, ref in zip(grads, want_grads):
                torch.testing.assert_close(got, ref, rtol=1e-9, atol=1e-9)
    finally:
        for name in ("_attention_bwd_fused_kernel", "_attention_bwd_ds_kernel"):
            vars(getattr(kernels, name)).pop("run", None)


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


def test_cpp_attention_gradients_under_torch_compile_equal_eager():
    """Compiled, the custom op and its autograd formula run; eager, a plain autograd.Function: the same kernels."""
    q, z, y = (torch.randn(2, n, 8, requires_grad=True) for n in (3, 5, 5))
    lengths = torch.tensor([5, 3])
    runnable("cpp", "attention_embsum", q, z, y, lengths)
    fn = lambda q, z, y: ck.attention_embsum(q, z, y, lengths, backend="cpp", return_attn=True)
    compiled = torch.compile(fn, backend="aot_eager", fullgraph=True)
    got = torch.autograd.grad(sum((o * o).sum() for o in compiled(q, z, y)), (q, z, y))
    want = torch.autograd.grad(sum((o * o).sum() for o in fn(q, z, y)), (q, z, y))
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w)


# --- the reference against an independent formulation ------------------------------------------
def naive_attention(q, z, y, lengths, left_pad):
    B, T, E = q.shape
    S = z.shape[1]
    ctx = torch.zeros(B, T, E, dtype=q.dtype)
    attn = torch.zeros(B, T, S, dtype=q.dtype)
    for b in range(B):
        L = S if lengths is None else int(lengths[b])
        valid = range(S - L, S) if left_pad else range(L)
        for t in range(T):
            scores = torch.stack([q[b, t] @ z[b, s] for s in valid])
            p = torch.exp(scores - scores.max())
            p = p / p.sum()
            for i, s in enumerate(valid):
                attn[b, t, s] = p[i]
                ctx[b, t] += p[i] * y[b, s]
            ctx[b, t] *= L * math.sqrt(1.0 / L)  # the paper's m * sqrt(1/m)
    return ctx, attn


@pytest.mark.parametrize("left_pad", [True, False], ids=["left_pad", "right_pad"])
@pytest.mark.parametrize("B,T,S,E", [(3, 4, 6, 8), (2, 1, 1, 5), (2, 3, 9, 7)])
def test_attention_ref_matches_naive_loop(B, T, S, E, left_pad):
    q, z, y = (torch.randn(B, n, E, dtype=torch.float64) / math.sqrt(E) ** 0.5 for n in (T, S, S))
    lengths = torch.randint(1, S + 1, (B,))
    lengths[0] = S
    for lens in (None, lengths):
        ctx, attn = ck.attention_embsum_ref(q, z, y, lens, left_pad=left_pad, return_attn=True)
        want_ctx, want_attn = naive_attention(q, z, y, lens, left_pad)
        torch.testing.assert_close(ctx, want_ctx, atol=1e-12, rtol=1e-10)
        torch.testing.assert_close(attn, want_attn, atol=1e-12, rtol=1e-10)


def test_attention_ref_ignores_padding_values():
    q, z, y = (torch.randn(2, n, 6, dtype=torch.float64) for n in (3, 5, 5))
    lengths = torch.tensor([3, 5])
    z2, y2 = z.clone(), y.clone()
    z2[0, :2] = 1e3  # garbage at the left padding of row 0
    y2[0, :2] = -1e3
    a = ck.attention_embsum_ref(q, z, y, lengths)
    b = ck.attention_embsum_ref(q, z2, y2, lengths)
    torch.testing.assert_close(a, b, atol=0, rtol=0)


def test_attention_ref_gradcheck():
    q, z, y = (torch.randn(2, n, 4, dtype=torch.float64, requires_grad=True) for n in (3, 5, 5))
    lengths = torch.tensor([2, 5])
    assert torch.autograd.gradcheck(lambda q, z, y: ck.attention_embsum_ref(q, z, y, lengths), (q, z, y))


# --- GPUs: bf16 and the paper's large shapes ---------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("B,T,S,E", [(160, 25, 25, 768), (160, 1, 25, 512), (16, 60, 50, 256), (8, 200, 300, 256)])
def test_attention_paper_shapes_on_gpu(B, T, S, E, dtype):
    dev = "cuda"
    q = (torch.randn(B, T, E, device=dev) * E ** -0.5).to(dtype).requires_grad_()
    z, y = (torch.randn(B, S, E, device=dev, dtype=dtype, requires_grad=True) for _ in range(2))
    lengths = torch.randint(1, S + 1, (B,), device=dev)
    ctx, attn = ck.attention_embsum(q, z, y, lengths, return_attn=True, backend="triton")
    rq, rz, ry = (t.detach().double().requires_grad_() for t in (q, z, y))
    want_ctx, want_attn = ck.attention_embsum_ref(rq, rz, ry, lengths, return_attn=True)
    assert_close("attention_embsum", ctx, want_ctx)
    assert_close("attention_embsum", attn, want_attn, what="attention probabilities")
    dctx = torch.randn_like(want_ctx)
    grads = torch.autograd.grad(ctx, (q, z, y), dctx.to(dtype))
    want = torch.autograd.grad(want_ctx, (rq, rz, ry), dctx)
    assert_grads_close(grads, want, "qzy", dtype)


# --- input errors -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "call,match",
    [
        (lambda: ck.attention_embsum(torch.randn(2, 3, 4), torch.randn(2, 5, 4), torch.randn(2, 5, 4),
                                     torch.tensor([0, 5])), r"src_lengths values must lie in \[1, 5\]"),
        (lambda: ck.attention_embsum(torch.randn(2, 3, 4), torch.randn(2, 5, 4), torch.randn(2, 6, 4)),
         "y must have shape"),
    ],
)
def test_attention_bad_inputs_name_the_problem(call, match):
    with pytest.raises((ValueError, TypeError), match=match):
        call()
