"""``decoder_step``: the one-call step of every decoder layer against its reference (the Python
loop over the other ops' references): float and int8 layers (float or int8 activations), projected and plain residuals,
layers with and without attention, padded sources, repeated beam parents; and the input errors."""

import dataclasses
import math

import pytest
import torch

import convs2s_kernels as ck
from harness import conv_weight, repeated_parents, runnable

# (C_in, C_out, k, residual, attention) per layer: widths change (projected residuals), one layer
# without attention, one residual reaching two layers back
LAYERS = [(12, 12, 3, 1, True), (12, 20, 3, 1, False), (20, 20, 2, 2, True), (20, 20, 1, 1, True)]
TOLERANCE = {torch.float32: dict(atol=1e-4, rtol=1e-4), torch.bfloat16: dict(atol=6e-2, rtol=5e-2)}


def step_layer(c_in, c_out, k, residual, attention, B, S, int8, dtype, c_prev):
    w, b = conv_weight(k, c_in, c_out, dtype)
    scale = None
    float_packed, int8 = int8 == "float-packed", False if int8 == "float-packed" else int8
    bits = 7 if int8 == "w7a7-packed" else 8  # the weights' width
    if int8:  # int8 rows (2C, k*C_in) of the linearised conv weight
        w, scale = ck.quantize_int8(w.float().reshape(k * c_in, 2 * c_out).t(), bits=bits)
        b = b.float()
    proj = {}
    if residual and c_prev != c_out:
        pw = torch.randn(c_out, c_prev) / math.sqrt(c_prev)
        proj = dict(proj_weight=pw.to(dtype), proj_bias=(0.1 * torch.randn(c_out)).to(dtype))
        if int8:
            pw, ps = ck.quantize_int8(pw, bits=bits)
            proj = dict(proj_weight=pw, proj_scale=ps, proj_bias=proj["proj_bias"].float())
    att = None
    if attention:
        att = ck.StepAttention(*(torch.randn(B, S, c_out, dtype=dtype) / math.sqrt(c_out) for _ in range(1)),
                               torch.randn(B, S, dtype=dtype), torch.randn(B, S, c_out, dtype=dtype),
                               (0.1 * torch.randn(c_out)).to(dtype))
    if float_packed and ck.pack_conv_step_weight(w) is not None:  # float weights in the cpp kernels' layout
        proj.update(conv_packed=ck.pack_conv_step_weight(w))
        if "proj_weight" in proj:
            proj.update(proj_packed=ck.pack_linear_weight(proj["proj_weight"]))
    if int8 in ("w8a8-packed", "w7a8-packed", "w7a7-packed"):  # the cpp kernels' layout of each int8 weight, made once
        proj.update(conv_packed=ck.pack_w8a8_weight(w))
        if "proj_scale" in proj:
            proj.update(proj_packed=ck.pack_w8a8_weight(proj["proj_weight"]))
    return ck.StepLayer(w, b, scale, residual, attention=att,
                        int8_activations=int8 in ("w8a8", "w8a8-packed", "w7a8-packed", "w7a7-packed"),
                        activation_bits=7 if int8 in ("w7a8-packed", "w7a7-packed") else 8, weight_bits=bits, **proj)


def make_step(B, beam, S, int8=False, dtype=torch.float32):
    layers, states, widths = [], [], [LAYERS[0][0]]
    for c_in, c_out, k, r, att in LAYERS:
        layers.append(step_layer(c_in, c_out, k, r, att, B, S, int8, dtype, widths[-r]))
        states.append(torch.randn(B * beam, k - 1, c_in, dtype=dtype))
        widths.append(c_out)
    x = torch.randn(B * beam, LAYERS[0][0], dtype=dtype)
    emb_scores = torch.randn(B, beam, S, dtype=dtype)
    lengths = torch.randint(1, S + 1, (B,))
    lengths[0] = S
    pad_mask = torch.arange(S)[None, :] < (S - lengths)[:, None]  # left padding
    return x, states, layers, emb_scores, pad_mask, lengths


@pytest.mark.parametrize("int8,dtype", [(False, torch.float32), (False, torch.bfloat16), (True, torch.float32),
                                        ("w8a8", torch.float32), ("w8a8-packed", torch.float32),
                                        ("w7a8-packed", torch.float32), ("w7a7-packed", torch.float32),
                                        ("float-packed", torch.float32), ("float-packed", torch.bfloat16)],
                         ids=["fp32", "bf16", "int8_weights", "w8a8", "w8a8_packed", "w7a8_packed", "w7a7_packed",
                              "fp32_packed", "bf16_packed"])
# int8 weights take fp32 activations; *_packed: each weight also in the cpp kernels' layout; w7a8:
# activations quantised to 7 bits; w7a7: the weights too
# 65 beams: past the few-row kernels' 64 rows, the float32 attention takes ATen's batched products
@pytest.mark.parametrize("B,beam,S", [(1, 1, 1), (2, 3, 5), (3, 2, 9), (1, 65, 3)])
@pytest.mark.parametrize("need_attn", [True, False], ids=["attn", "no_attn"])
@torch.no_grad()
def test_decoder_step_cpp_matches_reference(B, beam, S, int8, dtype, need_attn):
    x, states, layers, emb, pad, lengths = make_step(B, beam, S, int8, dtype)
    parents = repeated_parents(B * beam, B * beam)
    runnable("cpp", "decoder_step", x, states, layers, emb, pad, lengths, parents)
    before = [s.clone() for s in states]
    got = ck.decoder_step(x, states, layers, emb, pad, lengths, parents, need_attn=need_attn, backend="cpp")
    want = ck.decoder_step_ref(x, states, layers, emb, pad, lengths, parents, need_attn=need_attn)
    torch.testing.assert_close(got[0], want[0], **TOLERANCE[dtype])
    assert (got[1] is None) == (not need_attn)
    if need_attn:
        torch.testing.assert_close(got[1], want[1], **TOLERANCE[dtype])
        assert torch.all(got[1][pad.repeat_interleave(beam, 0)] == 0), "padded source steps get no attention"
    # the first layer's new state is an exact copy of its inputs; later ones hold computed activations
    assert torch.equal(got[2][0], want[2][0])
    for new, ref, old, state in zip(got[2], want[2], before, states):
        torch.testing.assert_close(new, ref, **TOLERANCE[dtype])
        assert torch.equal(state, old), "the input states are never modified"


@torch.no_grad()
def test_decoder_step_ref_equals_chained_op_references():
    """Layer by layer, the reference is the conv step, the folded attention and the residual sum."""
    x, states, layers, emb, pad, lengths = make_step(2, 2, 4, dtype=torch.float64)
    out, _, new_states = ck.decoder_step_ref(x, states, layers[:1], emb, pad, lengths)
    h, st = ck.conv_step_ref(x, states[0], layers[0].conv_weight, layers[0].conv_bias)
    a = layers[0].attention
    scores = (torch.bmm(h.view(2, 2, -1), a.z_in.mT) + a.z_bias[:, None] + emb) * math.sqrt(0.5)
    p = scores.masked_fill(pad[:, None], float("-inf")).softmax(-1)
    ctx = torch.bmm(p, a.y_out) * lengths.double().sqrt().view(-1, 1, 1)
    h = ((ctx + a.b_out + h.view(2, 2, -1)) * math.sqrt(0.5)).reshape(4, -1)
    torch.testing.assert_close(out, (h + x) * math.sqrt(0.5), atol=1e-12, rtol=1e-10)
    assert torch.equal(new_states[0], st)


def test_decoder_step_bad_inputs_name_the_problem():
    x, states, layers, emb, pad, lengths = make_step(2, 2, 4)
    with pytest.raises(ValueError, match="states has 3 entries but there are 4 layers"):
        ck.decoder_step(x, states[:3], layers, emb, pad, lengths)
    with pytest.raises(ValueError, match="not B \\* beam"):
        ck.decoder_step(x[:3], states, layers, emb, pad, lengths)
    with pytest.raises(ValueError, match="pad_mask must have shape"):
        ck.decoder_step(x, states, layers, emb, pad[:, :3], lengths)
    with pytest.raises(TypeError, match="StepLayer"):
        ck.decoder_step(x, states, [None] * 4, emb, pad, lengths)
    with pytest.raises(ValueError, match="reaches before the first layer"):
        bad = [ck.StepLayer(layers[0].conv_weight, residual=2)] + list(layers[1:])
        ck.decoder_step(x, states, bad, emb, pad, lengths)
    with pytest.raises(ValueError, match=r"layers\[1\]\.activation_bits must be 8 or 7, got 6"):
        bad = [layers[0], dataclasses.replace(layers[1], int8_activations=True, activation_bits=6)] + list(layers[2:])
        ck.decoder_step(x, states, bad, emb, pad, lengths)
    with pytest.raises(ValueError, match=r"layers\[2\]\.weight_bits must be 8 or 7, got 4"):
        bad = list(layers[:2]) + [dataclasses.replace(layers[2], weight_bits=4)] + list(layers[3:])
        ck.decoder_step(x, states, bad, emb, pad, lengths)
    _, _, int8_layers, _, _, _ = make_step(2, 2, 4, "w8a8")
    with pytest.raises(ValueError, match=r"qweight holds values outside \[-63, 63\]"):  # 8-bit weights called 7-bit
        bad = [dataclasses.replace(layer, weight_bits=7) for layer in int8_layers]
        ck.decoder_step(x, states, bad, emb, pad, lengths)
    with pytest.raises(ValueError, match=r"beam_index values must lie in \[0, 3\]"):
        ck.decoder_step(x, states, layers, emb, pad, lengths, torch.tensor([0, 1, 2, 4]))
    # a bias one short would be read past its end by the few-row kernels
    out = layers[0].conv_weight.shape[-1]
    with pytest.raises(ValueError, match=rf"layers\[0\]\.conv_bias must have shape \({out},\), one per output, got \({out - 1},\)"):
        bad = [dataclasses.replace(layers[0], conv_bias=layers[0].conv_bias[:-1])]
        ck.decoder_step(x, states, bad + list(layers[1:]), emb, pad, lengths)
    with pytest.raises(ValueError, match=r"layers\[0\]\.proj_bias is given but layers\[0\]\.proj_weight is None"):
        bad = [dataclasses.replace(layers[0], proj_weight=None, proj_bias=torch.zeros(3))]
        ck.decoder_step(x, states, bad + list(layers[1:]), emb, pad, lengths)
    with pytest.raises(ValueError, match="emb_scores is on meta but x is on cpu"):
        ck.decoder_step(x, states, layers, emb.to("meta"), pad, lengths)
    # a float conv weight takes its conv-step packing only, never the int8 one
    with pytest.raises(ValueError, match=r"packed must be pack_conv_step_weight\(weight\)"):
        bad = [dataclasses.replace(layers[0], conv_packed=torch.zeros(1, 16, 64, 4, dtype=torch.int8))]
        ck.decoder_step(x, states, bad + list(layers[1:]), emb, pad, lengths)
    stale = ck.pack_conv_step_weight(layers[0].conv_weight + 1)
    if stale is not None:  # with the cpp extension
        with pytest.raises(ValueError, match="packed is not pack_conv_step_weight"):
            bad = [dataclasses.replace(layers[0], conv_packed=stale)]
            ck.decoder_step(x, states, bad + list(layers[1:]), emb, pad, lengths)
    with pytest.raises(ValueError, match=r"layers\[0\]\.proj_packed is given but layers\[0\]\.proj_weight is None"):
        bad = [dataclasses.replace(layers[0], proj_weight=None, proj_packed=torch.zeros(1, 4, 16))]
        ck.decoder_step(x, states, bad + list(layers[1:]), emb, pad, lengths)
    with pytest.raises(ValueError, match="states\\[2\\] has 3 rows but states\\[0\\] has 4"):
        ck.decoder_step(x, states[:2] + [states[2][:3]] + states[3:], layers, emb, pad, lengths)
    short = [dataclasses.replace(layers[0], attention=dataclasses.replace(layers[0].attention,
                                                                          z_in=layers[0].attention.z_in[:, :3]))]
    with pytest.raises(RuntimeError, match=r"z_in and y_out must be CPU \(B, S, C\)"):
        ck.decoder_step(x, states, short + list(layers[1:]), emb, pad, lengths, backend="cpp")
    x, states, layers, emb, pad, lengths = make_step(2, 2, 4, int8="w8a8")
    bad_q = layers[0].conv_weight.clone()
    bad_q[0, 0] = -128
    with pytest.raises(ValueError, match="qweight holds -128"):
        ck.decoder_step(x, states, [dataclasses.replace(layers[0], conv_weight=bad_q)] + list(layers[1:]), emb, pad,
                        lengths)
    x, states, layers, emb, pad, lengths = make_step(2, 2, 4, int8="w8a8-packed")
    with pytest.raises(ValueError, match="packed is not pack_w8a8_weight"):
        stale = [dataclasses.replace(layers[0], conv_packed=ck.pack_w8a8_weight(-layers[0].conv_weight))]
        ck.decoder_step(x, states, stale + list(layers[1:]), emb, pad, lengths)


@torch.no_grad()
def test_decoder_step_strided_inputs():
    """Channel-strided activations and states and batch-inner scores (views of other layouts) give
    the reference's result (the C++ step once refused channel-strided inputs)."""
    x, states, layers, emb, pad, lengths = make_step(2, 2, 5)
    runnable("cpp", "decoder_step", x, states, layers, emb, pad, lengths)
    want = ck.decoder_step_ref(x, states, layers, emb, pad, lengths, need_attn=True)
    x_t = x.t().contiguous().t()  # (N, C) stored column-major
    states_t = [s.permute(2, 0, 1).contiguous().permute(1, 2, 0) for s in states]
    emb_t = emb.permute(2, 0, 1).contiguous().permute(1, 2, 0)
    assert x_t.stride(-1) != 1 and states_t[0].stride(-1) != 1
    got = ck.decoder_step(x_t, states_t, layers, emb_t, pad, lengths, need_attn=True, backend="cpp")
    torch.testing.assert_close(got[0], want[0], **TOLERANCE[torch.float32])
    torch.testing.assert_close(got[1], want[1], **TOLERANCE[torch.float32])
