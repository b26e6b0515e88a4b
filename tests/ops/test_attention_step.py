"""``attention_step``: the Triton backend against the reference in float64 and lower precisions
(beams per sentence from 1 to past one row tile, channels and sources past one tile, left and
right padding, a single valid step, with and without residual and probabilities, strided inputs),
the reference against the model's own attention layer, and the input errors."""

import math

import pytest
import torch

import convs2s_kernels as ck
from convs2s_kernels.testing import assert_close
from harness import runnable

# (B, beam, S, C): one row, a beam, rows past one tile (16), channels and sources past one tile
CASES = [
    pytest.param(1, 1, 1, 8, id="one_row_one_step"),
    pytest.param(3, 5, 7, 12, id="beam5_odd"),
    pytest.param(2, 17, 9, 20, id="rows_past_a_tile"),
    pytest.param(3, 2, 37, 70, id="sources_and_channels_past_a_tile"),
]


def step_inputs(B, beam, S, C, dtype, residual=True, lengths=True):
    g = torch.Generator().manual_seed(B * 1000 + beam * 100 + S + C)
    r = lambda *shape, scale=1.0: (torch.randn(*shape, generator=g, dtype=torch.float64) * scale).to(dtype)
    h = r(B, beam, C)
    inputs = dict(h=h, emb_scores=r(B, beam, S), z_bias=r(B, S, scale=0.5), z_in=r(B, S, C, scale=C ** -0.5),
                  y_out=r(B, S, C), b_out=r(C, scale=0.1))
    src_lengths = torch.randint(1, S + 1, (B,), generator=g) if lengths else torch.full((B,), S)
    src_lengths[0] = S
    src_lengths[-1] = 1 if B > 1 else src_lengths[-1]
    inputs["src_lengths"] = src_lengths
    inputs["residual"] = r(B, beam, C) if residual else None
    return inputs


def reference64(inputs, **kwargs):
    return ck.attention_step_ref(**{k: (v.double() if v is not None and v.is_floating_point() else v)
                                    for k, v in inputs.items()}, **kwargs)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("left_pad", [True, False], ids=["left_pad", "right_pad"])
@pytest.mark.parametrize("residual", [True, False], ids=["residual", "no_residual"])
@pytest.mark.parametrize("B,beam,S,C", CASES)
def test_triton_matches_reference(B, beam, S, C, residual, left_pad, dtype):
    inputs = step_inputs(B, beam, S, C, dtype, residual)
    runnable("triton", "attention_step", *inputs.values())
    out, attn = ck.attention_step(**inputs, left_pad=left_pad, need_attn=True, backend="triton")
    want_out, want_attn = reference64(inputs, left_pad=left_pad, need_attn=True)
    assert out.dtype == attn.dtype == dtype
    assert_close("attention_step", out, want_out)
    assert_close("attention_step", attn, want_attn, what="attention probabilities")
    pad = ck.reference.source_key_mask(inputs["src_lengths"], S, left_pad)
    assert torch.all(attn.transpose(0, 1)[:, pad] == 0), "padded source steps get no attention"
    only, none = ck.attention_step(**inputs, left_pad=left_pad, backend="triton")
    assert none is None and torch.equal(only, out), "the probabilities' pass changes nothing else"


def test_triton_strided_inputs():
    """Slices of larger buffers (offset starts, batch not the outer dimension) give the reference's result."""
    B, beam, S, C = 3, 4, 6, 10
    inputs = step_inputs(B, beam, S, C, torch.float64)
    inputs["h"] = torch.randn(B, beam, 2 * C, dtype=torch.float64)[:, :, C:]
    inputs["z_in"] = torch.randn(B, S + 2, C, dtype=torch.float64)[:, 1:S + 1]
    inputs["y_out"] = torch.randn(S, B, C, dtype=torch.float64).transpose(0, 1)
    inputs["emb_scores"] = torch.randn(beam, B, S, dtype=torch.float64).transpose(0, 1)
    inputs["z_bias"] = torch.randn(S, B, dtype=torch.float64).t()
    inputs["residual"] = torch.randn(B, 2 * beam, C, dtype=torch.float64)[:, ::2]
    runnable("triton", "attention_step", *inputs.values())
    out, attn = ck.attention_step(**inputs, need_attn=True, backend="triton")
    want_out, want_attn = ck.attention_step_ref(**inputs, need_attn=True)
    assert_close("attention_step", out, want_out)
    assert_close("attention_step", attn, want_attn, what="attention probabilities")


@torch.no_grad()
def test_reference_is_the_models_folded_attention_with_its_residual():
    """Against the paper's attention layer itself (projections, not folded), in float64: the fold's
    algebra, the sqrt(s) scale and the two sqrt(1/2) sums."""
    torch.manual_seed(0)
    B, beam, S, C, E = 2, 3, 5, 6, 4
    w_in, b_in = torch.randn(E, C, dtype=torch.float64), torch.randn(E, dtype=torch.float64)
    w_out, b_out = torch.randn(C, E, dtype=torch.float64), torch.randn(C, dtype=torch.float64)
    z, y = torch.randn(B, S, E, dtype=torch.float64), torch.randn(B, S, E, dtype=torch.float64)
    h, g = torch.randn(B, beam, C, dtype=torch.float64), torch.randn(B, beam, E, dtype=torch.float64)
    residual, lengths = torch.randn(B, beam, C, dtype=torch.float64), torch.tensor([5, 3])
    d = (h @ w_in.T + b_in + g) * math.sqrt(0.5)  # the paper's decoder summary d = (W h + b + g) sqrt(1/2)
    ctx, attn = ck.attention_embsum_ref(d, z, y, lengths, return_attn=True)
    want = (((ctx @ w_out.T + b_out) + h) * math.sqrt(0.5) + residual) * math.sqrt(0.5)
    out, got_attn = ck.attention_step_ref(h, g @ z.mT, z @ b_in, z @ w_in, y @ w_out.T, b_out, lengths, residual,
                                          need_attn=True)
    torch.testing.assert_close(out, want, atol=1e-12, rtol=1e-10)
    torch.testing.assert_close(got_attn, attn, atol=1e-12, rtol=1e-10)


@pytest.mark.parametrize("change,match", [
    (dict(h=torch.randn(2, 3)), "h must have 3 dimensions"),
    (dict(z_in=torch.randn(2, 5, 7)), r"z_in must have shape \(B, S, C\)"),
    (dict(y_out=torch.randn(2, 4, 6)), r"y_out must have shape \(B, S, C\)"),
    (dict(emb_scores=torch.randn(2, 2, 5)), r"emb_scores must have shape \(B, beam, S\)"),
    (dict(z_bias=torch.randn(2, 4)), r"z_bias must have shape \(B, S\)"),
    (dict(b_out=torch.randn(5)), r"b_out must have shape \(C,\)"),
    (dict(residual=torch.randn(2, 3, 5)), r"residual must have shape \(B, beam, C\)"),
    (dict(src_lengths=torch.tensor([6, 1])), r"src_lengths values must lie in \[1, 5\]"),
    (dict(b_out=torch.randn(6, dtype=torch.float64)), "b_out has dtype torch.float64"),
    (dict(z_in=torch.randn(2, 0, 6), y_out=torch.randn(2, 0, 6), emb_scores=torch.randn(2, 3, 0),
          z_bias=torch.randn(2, 0)), "no source positions"),
])
def test_bad_inputs_are_named_in_one_line(change, match):
    inputs = dict(step_inputs(2, 3, 5, 6, torch.float32), **change)
    with pytest.raises((ValueError, TypeError), match=match):
        ck.attention_step(**inputs, backend="reference")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("B,beam,S,C", [(128, 5, 25, 512), (1, 5, 25, 1024), (4, 5, 205, 2048)])
@torch.no_grad()
def test_attention_step_paper_shapes_on_gpu(B, beam, S, C, dtype):
    """Table 3's batch, one sentence, and the longest newstest source at the widest layer, on CUDA."""
    inputs = {k: (v.cuda() if v is not None else v) for k, v in step_inputs(B, beam, S, C, dtype).items()}
    out, attn = ck.attention_step(**inputs, need_attn=True, backend="triton")
    want_out, want_attn = reference64(inputs, need_attn=True)
    assert_close("attention_step", out, want_out)
    assert_close("attention_step", attn, want_attn, what="attention probabilities")
