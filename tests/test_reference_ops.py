"""Each reference op against an independent formulation (explicit tap loops, naive attention loops)."""

import math

import pytest
import torch
import torch.nn.functional as F

from convs2s_kernels.reference import attention_embsum_ref, conv_glu_ref, conv_step_ref, conv_padding

DT = torch.float64


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


def random_conv(B, T, c_in, c_out, k, dtype=DT):
    x = torch.randn(B, T, c_in, dtype=dtype)
    w = torch.randn(k, c_in, 2 * c_out, dtype=dtype) / math.sqrt(k * c_in)
    b = torch.randn(2 * c_out, dtype=dtype) * 0.1
    return x, w, b


CONV_SHAPES = [
    pytest.param(2, 7, 8, 8, 3, id="B2_T7_C8_k3"),
    pytest.param(1, 1, 5, 3, 3, id="T1_k3"),
    pytest.param(3, 2, 6, 4, 5, id="k5_gt_T2"),
    pytest.param(2, 9, 41, 13, 4, id="even_k4_odd_C41"),
    pytest.param(2, 6, 16, 8, 1, id="k1"),
    pytest.param(2, 5, 7, 9, 2, id="k2"),
]


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "centred"])
@pytest.mark.parametrize("B,T,c_in,c_out,k", CONV_SHAPES)
def test_conv_glu_ref_matches_tap_loop(B, T, c_in, c_out, k, causal):
    x, w, b = random_conv(B, T, c_in, c_out, k)
    residual = torch.randn(B, T, c_out, dtype=DT)
    pad_mask = torch.zeros(B, T, dtype=torch.bool)
    pad_mask[0, : T // 2] = True  # left padding on the first row
    for kw in (dict(), dict(residual=residual, scale=math.sqrt(0.5)), dict(pad_mask=pad_mask)):
        got = conv_glu_ref(x, w, b, causal=causal, **kw)
        want = naive_conv_glu(x, w, b, causal, **kw)
        torch.testing.assert_close(got, want, atol=1e-12, rtol=1e-10)


def test_conv_padding_rule():
    assert conv_padding(3, causal=True) == (2, 0)
    assert conv_padding(3, causal=False) == (1, 1)
    assert conv_padding(4, causal=False) == (1, 2)  # fairseq's even-k rule
    assert conv_padding(1, causal=False) == (0, 0)


def test_conv_glu_ref_is_causal():
    x, w, b = random_conv(1, 8, 4, 4, 3)
    base = conv_glu_ref(x, w, b, causal=True)
    x2 = x.clone()
    x2[:, 5:] += 1.0
    out2 = conv_glu_ref(x2, w, b, causal=True)
    torch.testing.assert_close(out2[:, :5], base[:, :5], atol=0, rtol=0)
    assert not torch.allclose(out2[:, 5:], base[:, 5:])


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
    q, z, y = (torch.randn(B, n, E, dtype=DT) / math.sqrt(E) ** 0.5 for n in (T, S, S))
    lengths = torch.randint(1, S + 1, (B,))
    lengths[0] = S
    for lens in (None, lengths):
        ctx, attn = attention_embsum_ref(q, z, y, lens, left_pad=left_pad, return_attn=True)
        want_ctx, want_attn = naive_attention(q, z, y, lens, left_pad)
        torch.testing.assert_close(ctx, want_ctx, atol=1e-12, rtol=1e-10)
        torch.testing.assert_close(attn, want_attn, atol=1e-12, rtol=1e-10)


def test_attention_ref_ignores_padding_values():
    q, z, y = (torch.randn(2, n, 6, dtype=DT) for n in (3, 5, 5))
    lengths = torch.tensor([3, 5])
    z2, y2 = z.clone(), y.clone()
    z2[0, :2] = 1e3  # garbage at the left padding of row 0
    y2[0, :2] = -1e3
    a = attention_embsum_ref(q, z, y, lengths)
    b = attention_embsum_ref(q, z2, y2, lengths)
    torch.testing.assert_close(a, b, atol=0, rtol=0)


@pytest.mark.parametrize("k", [1, 2, 3, 5])
def test_conv_step_ref_matches_full_causal_conv(k):
    """Stepping through a sequence with the FIFO state equals the causal convolution."""
    B, T, c_in, c_out = 3, 6, 5, 4
    x, w, b = random_conv(B, T, c_in, c_out, k)
    full = conv_glu_ref(x, w, b, causal=True)
    state = torch.zeros(B, k - 1, c_in, dtype=DT)
    for t in range(T):
        out, state = conv_step_ref(x[:, t], state, w, b)
        torch.testing.assert_close(out, full[:, t], atol=1e-12, rtol=1e-10)


def test_conv_step_ref_reorder_with_repeated_parents():
    k, c_in, c_out = 3, 4, 2
    _, w, b = random_conv(1, 1, c_in, c_out, k)
    state = torch.randn(4, k - 1, c_in, dtype=DT)
    before = state.clone()
    x_t = torch.randn(5, c_in, dtype=DT)
    parents = torch.tensor([2, 2, 0, 3, 2])
    out, new_state = conv_step_ref(x_t, state, w, b, parents)
    assert torch.equal(state, before), "the input state must not be modified"
    for n, p in enumerate(parents.tolist()):
        window = torch.cat([state[p], x_t[n : n + 1]], 0)
        pre = window.reshape(-1) @ w.reshape(-1, 2 * c_out) + b
        torch.testing.assert_close(out[n], F.glu(pre, dim=-1), atol=1e-12, rtol=1e-10)
        assert torch.equal(new_state[n], window[1:])


def test_reference_ops_gradcheck():
    x, w, b = random_conv(2, 4, 3, 2, 3)
    res = torch.randn(2, 4, 2, dtype=DT)
    args = [t.requires_grad_() for t in (x, w, b, res)]
    assert torch.autograd.gradcheck(lambda x, w, b, r: conv_glu_ref(x, w, b, causal=True, residual=r, scale=0.7), args)
    q, z, y = (torch.randn(2, n, 4, dtype=DT, requires_grad=True) for n in (3, 5, 5))
    lengths = torch.tensor([2, 5])
    assert torch.autograd.gradcheck(lambda q, z, y: attention_embsum_ref(q, z, y, lengths), (q, z, y))


def test_ops_follow_autocast_like_pytorch_layers():
    """Under bf16 autocast the ops cast their inputs as F.conv1d / matmul would (mixed fp32
    weights and bf16 activations), and still match the reference on the cast inputs."""
    import convs2s_kernels as ck
    from convs2s_kernels.reference import conv_glu_ref

    torch.manual_seed(0)
    x = torch.randn(2, 5, 8)
    w = torch.randn(3, 8, 12) / 5
    b = torch.randn(12)
    res = torch.randn(2, 5, 6)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = ck.conv_glu(x.bfloat16(), w, b, causal=True, residual=res, scale=0.5, backend="reference")
        ctx = ck.attention_embsum(torch.randn(2, 3, 8).bfloat16(), x, x, torch.tensor([5, 3]), backend="reference")
    assert out.dtype == torch.bfloat16 and ctx.dtype == torch.bfloat16
    want = conv_glu_ref(x.bfloat16(), w.bfloat16(), b.bfloat16(), causal=True, residual=res.bfloat16(), scale=0.5)
    torch.testing.assert_close(out, want, rtol=0, atol=0)
