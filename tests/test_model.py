"""The ConvS2S model: fairseq equivalence, incremental decoding, padding, init, sizes and errors."""

import math
import os
from pathlib import Path

import pytest
import torch

import convs2s
import convs2s_kernels as ck
from convs2s.architectures import ARCHITECTURES, ConfigError, UnknownOptionError, parse_layer_spec
from convs2s.special_tokens import EOS, PAD
from convs2s_kernels.ops.conv_glu import conv_glu_ref
from convs2s_kernels.testing import assert_close
from harness import require_or_skip, required_backends
from convs2s.engine import prepare, quantize_decoder_int8, quantize_encoder_int8

V_SRC, V_TGT = 37, 41


def random_batch(B, S, T, v_src=V_SRC, v_tgt=V_TGT, lengths=None):
    """Left-padded sources ending in EOS and right-padded decoder inputs starting with EOS."""
    lengths = lengths or [S] * B
    src = torch.full((B, S), PAD, dtype=torch.long)
    for b, L in enumerate(lengths):
        src[b, S - L :] = torch.randint(4, v_src, (L,))
        src[b, -1] = EOS
    prev = torch.randint(4, v_tgt, (B, T))
    prev[:, 0] = EOS
    return src, prev


def small(arch, **kw):
    torch.manual_seed(0)
    return convs2s.build_model(arch, V_SRC, V_TGT, **kw).eval()


def plain_step_logits(model, src, prev):
    """The model's own incremental step (Decoder.forward_step), no engine."""
    with torch.no_grad():
        state = model.decoder.init_incremental_state(model.encode(src))
        outs = [model.decoder.forward_step(prev[:, t], state) for t in range(prev.shape[1])]
    return torch.stack([o[0] for o in outs], 1), torch.stack([o[1] for o in outs], 1)


def step_logits(model, src, prev, beam=1):
    """The engine's step (convs2s.engine: the prepared model's)."""
    with torch.no_grad():
        state = prepare(model).init_decoder_state(prepare(model).encode(src), beam)
        outs = [prepare(model).decode_step(prev[:, t], state, need_attn=True) for t in range(prev.shape[1])]
    return torch.stack([o[0] for o in outs], 1), torch.stack([o[1] for o in outs], 1)


@pytest.mark.parametrize("arch", sorted(ARCHITECTURES))
def test_incremental_equals_full_forward_named_arch(arch):
    model = small(arch)
    src, prev = random_batch(2, 6, 5, lengths=[6, 3])
    with torch.no_grad():
        full, attn = model(src, None, prev)
    for steps in (step_logits, plain_step_logits):
        inc, inc_attn = steps(model, src, prev)
        assert (inc - full).abs().max() <= 1e-5, steps.__name__
        assert (inc_attn - attn).abs().max() <= 1e-5, steps.__name__


def test_the_plain_step_follows_a_beam_reorder_with_repeated_parents_in_float64():
    """The model's own step with its state reordered (repeated parents) gives each row the full
    forward's logits for its reconstructed history, in float64 on an odd custom stack."""
    model = small("custom", **CUSTOM).double()
    src, _ = random_batch(2, 7, 1, lengths=[7, 4])
    rows = src.repeat_interleave(3, 0)
    gen = torch.Generator().manual_seed(5)
    history = torch.full((6, 1), EOS, dtype=torch.long)
    with torch.no_grad():
        state = model.decoder.init_incremental_state(model.encode(rows))
        for t in range(5):
            logits, _ = model.decoder.forward_step(history[:, -1], state)
            full, _ = model(rows, None, history)
            torch.testing.assert_close(logits, full[:, -1], atol=1e-10, rtol=1e-10)
            parents = (torch.arange(6) // 3) * 3 + torch.randint(0, 3, (6,), generator=gen)  # within its sentence
            parents[1] = parents[0]  # a repeated parent
            history = torch.cat([history.index_select(0, parents), torch.randint(4, V_TGT, (6, 1), generator=gen)], 1)
            state.reorder(parents)
        with pytest.raises(ValueError, match="tokens must have shape"):
            model.decoder.forward_step(history[:3, -1], state)


CUSTOM = dict(
    encoder_embed_dim=24, decoder_embed_dim=24,
    encoder_layers="[(16, 3)] * 2 + [(32, 4)] + [(32, 1), (20, 5, 2), (20, 2, 0)]",
    decoder_layers="[(16, 3), (32, 2), (32, 7), (24, 1), (24, 3, 3)]",
    decoder_attention="[True, False, True, False, True]",
    decoder_out_embed_dim=24,
)


@pytest.mark.parametrize("share", [False, True], ids=["separate_out", "shared_embed"])
def test_incremental_equals_full_custom_spec(share):
    """Width changes with projections, k = 1..7 incl. even, attention in a subset, residual 0/2/3."""
    model = small("custom", share_input_output_embed=share, **CUSTOM)
    src, prev = random_batch(3, 7, 9, lengths=[7, 2, 5])
    with torch.no_grad():
        full, attn = model(src, None, prev)
    inc, inc_attn = step_logits(model, src, prev)
    assert (inc - full).abs().max() <= 1e-5
    assert (inc_attn - attn).abs().max() <= 1e-5
    # fairseq's averaging quirk: divided by all layers, so rows sum to 3/5.
    torch.testing.assert_close(attn.sum(-1), torch.full_like(attn[..., 0], 3 / 5))


@pytest.mark.parametrize("arch", sorted(ARCHITECTURES))
def test_incremental_beam_reorder_with_repeated_parents(arch):
    """Reordering mid-sequence gives each row the logits of its reconstructed history."""
    model = small(arch)
    B, beam, T = 2, 3, 6
    src, _ = random_batch(B, 5, 1, lengths=[5, 3])
    N = B * beam
    gen = torch.Generator().manual_seed(3)
    history = torch.full((N, 1), EOS, dtype=torch.long)
    rows_logits = []
    with torch.no_grad():
        state = prepare(model).init_decoder_state(prepare(model).encode(src), beam)
        for t in range(T):
            logits, _ = prepare(model).decode_step(history[:, -1], state)
            rows_logits.append(logits)
            # parents chosen within each sentence, with repeats (e.g. [1, 1, 0])
            parents = torch.randint(0, beam, (B, beam), generator=gen)
            parents[:, 1] = parents[:, 0]
            parents = (parents + torch.arange(B).unsqueeze(1) * beam).view(-1)
            new_tok = torch.randint(4, V_TGT, (N, 1), generator=gen)
            history = torch.cat([history.index_select(0, parents), new_tok], 1)
            rows_logits = [l.index_select(0, parents) for l in rows_logits]
            state.reorder(parents)
        logits, _ = prepare(model).decode_step(history[:, -1], state)
        rows_logits.append(logits)
        inc = torch.stack(rows_logits, 1)
        full, _ = model(src.repeat_interleave(beam, 0), None, history)
    assert (inc - full).abs().max() <= 1e-5


def test_left_padded_sentence_equals_sentence_alone():
    model = small("fconv_iwslt_de_en")
    src, prev = random_batch(3, 8, 4, lengths=[8, 3, 5])
    with torch.no_grad():
        enc = model.encode(src)
        alone = model.encode(src[1:2, -3:])
        torch.testing.assert_close(enc.z[1, -3:], alone.z[0], atol=1e-6, rtol=1e-5)
        torch.testing.assert_close(enc.y[1, -3:], alone.y[0], atol=1e-6, rtol=1e-5)
        assert enc.z[1, :-3].abs().max() == 0  # pad steps zeroed
        batch_logits, _ = model(src, None, prev)
        single_logits, _ = model(src[1:2, -3:], None, prev[1:2])
    torch.testing.assert_close(batch_logits[1], single_logits[0], atol=1e-5, rtol=1e-5)


def test_fold_weight_norm_keeps_outputs():
    model = small("fconv_iwslt_de_en")
    src, prev = random_batch(2, 5, 4)
    with torch.no_grad():
        before, _ = model(src, None, prev)
        model.fold_weight_norm()
        after, _ = model(src, None, prev)
    assert not any(k.endswith("weight_g") for k in model.state_dict())
    torch.testing.assert_close(after, before, atol=1e-5, rtol=1e-5)


def test_init_statistics_match_paper():
    """Section 3.5 with fairseq's dropout-aware variants, checked on wide layers."""
    p = 0.2
    model = convs2s.build_model("custom", 500, 600, dropout=p, encoder_embed_dim=512, decoder_embed_dim=512,
                                encoder_layers="[(1024, 3)]", decoder_layers="[(1024, 3)]",
                                decoder_out_embed_dim=512)
    enc, dec = model.encoder, model.decoder

    def check_std(t, want, what):
        got = t.detach().float().std().item()
        # the sample std of n normals has relative sd ~ 1/sqrt(2n)
        assert abs(got / want - 1) < 5 / math.sqrt(2 * t.numel()), f"{what}: std {got:.5f}, expected {want:.5f}"
        assert abs(t.detach().float().mean().item()) < 5 * want / math.sqrt(t.numel()), f"{what}: mean"

    check_std(enc.embed_tokens.weight[2:], 0.1, "token embedding")
    assert enc.embed_tokens.weight[PAD].abs().max() == 0
    check_std(dec.embed_positions.weight[2:], 0.1, "position embedding")
    check_std(enc.fc1.effective_weight(), math.sqrt((1 - p) / 512), "fc1 (dropout on its input)")
    check_std(enc.fc2.effective_weight(), math.sqrt(1 / 1024), "encoder fc2 (no dropout)")
    check_std(enc.convolutions[0].effective_weight(), math.sqrt(4 * (1 - p) / (3 * 1024)), "conv before GLU")
    check_std(dec.attention[0].in_projection.effective_weight(), math.sqrt(1 / 1024), "attention in-projection")
    check_std(dec.fc3.effective_weight(), math.sqrt((1 - p) / 512), "fc3 (dropout on its input)")
    assert enc.convolutions[0].bias.abs().max() == 0
    # weight norm starts with g = ||v|| so the effective weight is v
    conv = enc.convolutions[0]
    torch.testing.assert_close(conv.effective_weight(), conv.weight_v)


def spec_param_count(arch, v_src, v_tgt):
    """Parameter count from the layer spec alone (fairseq naming, weight norm adds g per output)."""
    cfg = convs2s.get_config(arch)

    def linear(i, o):
        return i * o + o + o  # weight_v, bias, weight_g

    def side(spec, E, V, decoder):
        n = V * E + 1024 * E + linear(E, spec[0][0])
        widths = [spec[0][0]]
        c_in = spec[0][0]
        for c, k, r in spec:
            res = widths[-r] if r else None
            if res is not None and res != c:
                n += linear(res, c)
            n += k * c_in * 2 * c + 2 * c + 2 * c
            if decoder:
                n += linear(c, E) + linear(E, c)
            widths.append(c)
            c_in = c
        if decoder:
            n += linear(c_in, cfg.decoder_out_embed_dim) + linear(cfg.decoder_out_embed_dim, V)
        else:
            n += linear(c_in, E)
        return n

    return side(cfg.encoder_layers, cfg.encoder_embed_dim, v_src, False) + side(
        cfg.decoder_layers, cfg.decoder_embed_dim, v_tgt, True
    )


def test_en_fr_parameter_count_matches_spec():
    with torch.device("meta"):
        model = convs2s.build_model("fconv_wmt_en_fr", 40000, 40000)
    count = model.num_parameters()
    assert count == spec_param_count("fconv_wmt_en_fr", 40000, 40000)
    print(f"fconv_wmt_en_fr with 40K/40K vocabularies: {count:,} parameters")
    # fairseq's own count for the published model's dictionaries (notes section 1.9)
    with torch.device("meta"):
        assert convs2s.build_model("fconv_wmt_en_fr", 44206, 44463).num_parameters() == 267_063_390
        assert convs2s.build_model("fconv_iwslt_de_en", 8848, 6632).num_parameters() == 9_618_384


def test_grad_multiply_scales_encoder_gradient():
    """The encoder output's gradient is scaled by 1 / (2 * #attention layers); its forward is the identity."""
    model = convs2s.build_model("fconv_iwslt_de_en", V_SRC, V_TGT, dropout=0.0).train()
    B, S = 2, 5
    src, _ = random_batch(B, S, 1)
    model.encode(src).z.sum().backward()
    # d(sum z) / d(fc2.bias) is B * S per channel without the scaling; iwslt has 3 attention layers.
    expected = torch.full_like(model.encoder.fc2.bias, B * S / (2 * 3))
    torch.testing.assert_close(model.encoder.fc2.bias.grad, expected)


def test_parse_layer_spec():
    assert parse_layer_spec("[(512, 3)] * 2 + [(1024, 1, 0)]") == [(512, 3, 1), (512, 3, 1), (1024, 1, 0)]
    with pytest.raises(ValueError, match="invalid layer spec"):
        parse_layer_spec("__import__('os').system('true')")
    with pytest.raises(ValueError, match="residual"):
        parse_layer_spec([(8, 3, 5)])


@pytest.mark.parametrize(
    "make_input,match",
    [
        (lambda s, p: (s.float(), p), "integer token ids"),
        (lambda s, p: (s[0], p), r"shape \(B, T\)"),
        (lambda s, p: (s.clamp(max=V_SRC - 1) + V_SRC, p), r"ids must lie in \[0, 36\]"),
        (lambda s, p: (s, p + V_TGT), r"ids must lie in \[0, 40\]"),
        (lambda s, p: (torch.cat([s, torch.full((2, 1), PAD)], 1), p), "left-padded"),
        (lambda s, p: (torch.full((2, 1030), 5), p), "position table allows at most 1022"),
        (lambda s, p: (s, torch.full((2, 1100), 5)), "position table allows at most 1022"),
    ],
    ids=["float_tokens", "rank1", "src_out_of_range", "tgt_out_of_range", "right_padded_src", "src_too_long",
         "tgt_too_long"],
)
def test_bad_model_inputs(make_input, match):
    model = small("fconv_iwslt_de_en")
    src, prev = random_batch(2, 5, 4)
    src, prev = make_input(src, prev)
    with pytest.raises((ValueError, TypeError), match=match):
        model(src, None, prev)


def test_bad_configs():
    with pytest.raises(ConfigError, match="unknown architecture"):
        convs2s.build_model("fconv_xx", 10, 10)
    with pytest.raises(UnknownOptionError, match="unknown model options"):
        convs2s.build_model("fconv_iwslt_de_en", 10, 10, encoder_dim=3)
    with pytest.raises(ConfigError, match="decoder_attention must be a boolean or a list"):
        convs2s.build_model("fconv_iwslt_de_en", 10, 10, decoder_attention="[True,")
    with pytest.raises(ConfigError, match="must equal decoder_embed_dim"):
        convs2s.build_model("fconv_iwslt_de_en", 10, 10, encoder_embed_dim=128)
    with pytest.raises(ValueError, match="more than the 4 special symbols"):
        convs2s.build_model("fconv_iwslt_de_en", 4, 10)


def test_backend_none_means_the_dispatchers_default_in_the_engines_products_as_in_the_ops(monkeypatch):
    """None: the dispatcher's default (CONVS2S_KERNELS_BACKEND, else auto), for a Linear's and a
    convolution step's product on derived weights as for every op; NO_DISPATCH and the model's own
    layers are plain F.linear, whatever the engine derived (int8 included)."""
    from convs2s.engine.weights import NO_DISPATCH, DerivedWeights, conv_step, linear
    from convs2s.layers import ConvTBCWeight, Linear

    torch.manual_seed(0)
    lin, conv = Linear(16, 8), ConvTBCWeight(8, 16, 3)
    dl, dc = DerivedWeights(lin), DerivedWeights(conv)
    x, x_t, state = torch.randn(2, 16), torch.randn(2, 8), torch.zeros(2, 2, 8)
    monkeypatch.setenv("CONVS2S_KERNELS_BACKEND", "reference")
    with torch.no_grad(), ck.count_dispatches() as counts:
        plain = lin(x)
        assert torch.equal(linear(dl, lin, x, NO_DISPATCH), plain) and torch.equal(linear(dl, lin, x), plain)
        assert not counts, "NO_DISPATCH (the default) goes through no op"
        torch.testing.assert_close(linear(dl, lin, x, None), plain)
        linear(dl, lin, x, None)
        conv_step(dc, x_t, state, None, None)
        assert counts == {("linear", "reference"): 2, ("conv_step", "reference"): 1}
        counts.clear()
        dl.use_int8 = dc.use_int8 = True  # int8 weights serve the engine's dispatched calls only
        assert torch.equal(lin(x), plain) and not counts
        linear(dl, lin, x, None)
        conv_step(dc, x_t, state, None, None)
        assert counts == {("linear_w8a8", "reference"): 2}, "int8 activations by default"
        counts.clear()
        dl.int8_activations = dc.int8_activations = False  # weight-only int8
        linear(dl, lin, x, None)
        conv_step(dc, x_t, state, None, None)
        assert counts == {("linear_int8", "reference"): 2}


def test_package_works_without_the_extension(tmp_path):
    """With ``_C`` unimportable the reference backend runs everything and the reason is reported."""
    import subprocess
    import sys

    code = (
        "import sys; sys.modules['convs2s_kernels._C'] = None\n"
        "import torch, convs2s, convs2s_kernels as ck\n"
        "why = ck.available_backends()['cpp']\n"
        "assert why and 'could not be imported' in why and 'pip install' in why, why\n"
        "m = convs2s.build_model('fconv_iwslt_de_en', 20, 20).eval()\n"
        "out = convs2s.generate(m, [[5, 6, 7]], beam=2, max_len_b=3)\n"
        f"assert out[0][0]['tokens'][-1] == {EOS}\n"
        "print('OK', why)\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("OK")


def test_an_unbuilt_extension_is_reported_as_not_built(tmp_path):
    """A checkout with no build of ``_C`` (as on a GPU machine that got the sources alone) says so,
    not Python's "partially initialized module ... circular import" wording."""
    import shutil
    import subprocess
    import sys

    package = Path(__file__).resolve().parent.parent / "convs2s_kernels"
    # under another name: an editable install's import hook would hand back the built package itself
    shutil.copytree(package, tmp_path / "unbuilt_kernels", ignore=shutil.ignore_patterns("_C.*", "__pycache__"))
    code = ("import unbuilt_kernels as ck\n"
            "assert ck.__file__.startswith(%r), ck.__file__\n"
            "print(ck.available_backends()['cpp'])\n" % str(tmp_path))
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=tmp_path,
                         env={**os.environ, "PYTHONPATH": str(tmp_path)})
    assert res.returncode == 0, res.stderr
    assert "it is not built" in res.stdout and "circular" not in res.stdout, res.stdout


@pytest.mark.parametrize("activations", ["int8", "int7", "float"])
def test_int8_decoding_is_close_to_fp32_and_equal_across_backends(activations):
    model = small("fconv_iwslt_de_en")
    src, prev = random_batch(2, 6, 5, lengths=[6, 3])
    fp32, _ = step_logits(model, src, prev)
    with torch.no_grad():
        full_before, _ = model(src, None, prev)
    quantize_decoder_int8(model, activations=activations)
    with torch.no_grad():
        full_after, _ = model(src, None, prev)
    assert torch.equal(full_before, full_after), "int8 is for decoding steps only: the full forward is untouched"
    per_backend = {}
    for backend in ("reference", "cpp"):
        if ck.available_backends()[backend] is not None:
            assert backend not in required_backends(), ck.available_backends()[backend]
            continue
        model.use_backend(backend)
        per_backend[backend], _ = step_logits(model, src, prev)
    model.use_backend(None)
    int8 = per_backend["reference"]
    rel = ((int8 - fp32).norm() / fp32.norm()).item()
    assert 0 < rel < 0.1, f"int8 logits differ from fp32 by {rel:.3f} (relative L2)"
    if "cpp" in per_backend:
        torch.testing.assert_close(per_backend["cpp"], int8, atol=1e-5, rtol=1e-4)
    if activations == "int7":  # the 7 bits reach the products: coarser than 8, yet close to fp32
        quantize_decoder_int8(model, activations="int8").use_backend("reference")
        eight, _ = step_logits(model, src, prev)
        model.use_backend(None)
        assert not torch.equal(eight, int8)
        assert (eight - fp32).norm() < (int8 - fp32).norm()
    quantize_decoder_int8(model, False)
    again, _ = step_logits(model, src, prev)
    assert torch.equal(again, fp32), "turning int8 off restores the float32 weights exactly"
    with pytest.raises(ValueError, match="activations must be one of 'int8', 'int7', 'float', got 'fp8'"):
        quantize_decoder_int8(model, activations="fp8")


@torch.no_grad()
@pytest.mark.parametrize("bits", [(8, 8), (7, 8), (7, 7)], ids=["int8", "int7", "w7a7"])
@pytest.mark.parametrize("backend", ["cpp", "reference"])
def test_an_int8_step_folds_attention_in_int8(bits, backend):
    """A step with int8 weights and activations folds in int8 as well: the keys times W_in through
    linear_w8a8 with W_in^T quantised per row (its own copy, packed on the CPU, kept while the weight
    stays), the values through the out projection's own int8 weight; no float products. Equal to
    the reference op on the same quantised weights, close to the float fold, and a change of the
    weight bits is a new quantisation."""
    from convs2s.engine.state import FoldedAttention

    if backend == "cpp":
        require_or_skip("cpp")
    activation_bits, weight_bits = bits
    model = convs2s.build_model("fconv_iwslt_de_en", 50, 60).eval()
    quantize_decoder_int8(model, True, activations="int7" if activation_bits == 7 else "int8", weight_bits=weight_bits)
    g = torch.Generator().manual_seed(7)
    enc = model.encode(torch.cat([torch.randint(4, 50, (3, 29), generator=g), torch.full((3, 1), 2)], 1))
    attention = [a for a in model.decoder.attention if a is not None]
    d = prepare(model).derived
    layers = [(d(a.in_projection), d(a.out_projection)) for a in attention]
    cpu = [torch.profiler.ProfilerActivity.CPU]
    with ck.count_dispatches() as counts, torch.profiler.profile(activities=cpu) as prof:
        folded = [FoldedAttention(inp, out, enc, backend=backend) for inp, out in layers]
    assert counts[("linear_w8a8", backend)] == 2 * len(layers) and counts[("linear", backend)] == 0
    if backend == "cpp":  # (the reference op itself multiplies with aten::mm)
        assert not any(e.name in ("convs2s::few_rows_kn_packed", "aten::mm", "aten::addmm") for e in prof.events())
    opts = dict(activation_bits=activation_bits, weight_bits=weight_bits)
    for a, f in zip(attention, folded):
        w_in, w_out = a.in_projection.effective_weight(), a.out_projection.effective_weight()
        q_in, s_in = ck.quantize_int8(w_in.t(), bits=weight_bits)
        q_out, s_out = ck.quantize_int8(w_out, bits=weight_bits)
        assert_close("linear_w8a8", f.z_in, ck.linear_w8a8_ref(enc.z, q_in, s_in, **opts))
        assert_close("linear_w8a8", f.y_out, ck.linear_w8a8_ref(enc.y, q_out, s_out, **opts))
        for got, want in ((f.z_in, torch.matmul(enc.z, w_in)), (f.y_out, torch.matmul(enc.y, w_out.t()))):
            rel = ((got - want).norm() / want.norm()).item()
            assert 0 < rel < (0.05 if 7 in bits else 0.02), rel
    inp, out = layers[0]
    keys = inp.fold_int8(transposed=True)
    assert keys is inp.fold_int8(transposed=True)  # kept while the weight stays
    assert (keys[2] is not None) == (inp.packs_int8(keys[0]))
    other = 8 if weight_bits == 7 else 7
    quantize_decoder_int8(model, True, activations="int7", weight_bits=other)
    again = inp.fold_int8(transposed=True)
    widest = int(again[0].abs().max())
    assert (widest <= 63 if other == 7 else widest > 63) and not torch.equal(again[0], keys[0])
    with torch.enable_grad():  # with gradients the fold multiplies the float weights
        assert inp.fold_int8(transposed=True) is None and out.fold_int8() is None
    assert not any(slot.startswith("fold-int8") for slot in out._packs)  # W_out^T is never quantised
    quantize_decoder_int8(model, True, activations="float")
    assert inp.fold_int8(transposed=True) is None  # float activations fold in float


@pytest.mark.parametrize("part", ["decoder", "encoder"])
def test_seven_bit_weights_decode_close_to_fp32_and_equal_across_backends(part):
    """``weight_bits=7`` quantises the weights to [-63, 63] (every int8 weight of the part, held
    apart from the 8-bit ones), coarser than 8 bits yet close to fp32, the same on every backend
    (the cpp one-call step and the encoder's products included), and off again with 8."""
    model = small("custom", **CUSTOM) if part == "encoder" else small("fconv_iwslt_de_en")
    src, prev = random_batch(2, 6, 5, lengths=[6, 3])
    fp32, _ = step_logits(model, src, prev)
    quantize = getattr(prepare(model), f"quantize_{part}_int8")
    outs, weight_error = {}, {}
    for bits in (8, 7):
        quantize(activations="int7", weight_bits=bits)
        modules = [d for d in map(prepare(model).derived, getattr(model, part).modules()) if d and d.use_int8]
        weights = [m.int8_weight() for m in modules]
        assert weights and max(int(q.abs().max()) for q, _ in weights) == (63 if bits == 7 else 127)
        weight_error[bits] = sum(float((q.float() * s.unsqueeze(1) - m._int8_matrix().detach()).abs().sum())
                                 for m, (q, s) in zip(modules, weights))
        for backend in ("reference", "cpp"):
            if ck.available_backends()[backend] is not None:
                assert backend not in required_backends(), ck.available_backends()[backend]
                continue
            model.use_backend(backend)
            outs[(bits, backend)], _ = step_logits(model, src, prev)
    model.use_backend(None)
    seven, eight = outs[(7, "reference")], outs[(8, "reference")]
    assert 0 < ((seven - fp32).norm() / fp32.norm()).item() < 0.1
    assert weight_error[7] > 1.5 * weight_error[8], "7-bit weights are the coarser"
    assert not torch.equal(seven, eight), "the 7 bits reach the products"
    if (7, "cpp") in outs:
        torch.testing.assert_close(outs[(7, "cpp")], seven, atol=1e-5, rtol=1e-4)
    with pytest.raises(ValueError, match="weight_bits must be 8 or 7, got 6"):
        quantize(activations="int7", weight_bits=6)
    quantize(False)
    again, _ = step_logits(model, src, prev)
    assert torch.equal(again, fp32)


@pytest.mark.parametrize("activations", ["int8", "int7", "float"])
def test_int8_encoding_is_close_to_fp32_and_equal_across_backends(activations):
    """quantize_encoder_int8: the encoder's convolutions (centred, even widths, residuals 0/1/2,
    left padding) and linear layers on int8 weights when encoding without gradients, close to
    fp32 and the same on every backend; with gradients (training) the float32 encoder, untouched."""
    model = small("custom", **CUSTOM)
    src, _ = random_batch(3, 7, 2, lengths=[7, 2, 5])
    with torch.no_grad():
        fp32 = prepare(model).encode(src)
    quantize_encoder_int8(model, activations=activations)
    per_backend = {}
    for backend in ("reference", "cpp"):
        if ck.available_backends()[backend] is not None:
            assert backend not in required_backends(), ck.available_backends()[backend]
            continue
        with torch.no_grad():
            per_backend[backend] = prepare(model.use_backend(backend)).encode(src)
    model.use_backend(None)
    int8 = per_backend["reference"]
    assert torch.equal(int8.pad_mask, fp32.pad_mask) and torch.equal(int8.src_lengths, fp32.src_lengths)
    for got, want in ((int8.z, fp32.z), (int8.y, fp32.y)):
        rel = ((got - want).norm() / want.norm()).item()
        assert 0 < rel < 0.05, f"int8 encoder outputs differ from fp32 by {rel:.3f} (relative L2)"
    if "cpp" in per_backend:
        torch.testing.assert_close(per_backend["cpp"].z, int8.z, atol=1e-5, rtol=1e-4)
    trained = prepare(model).encode(src)  # gradients on: the float32 encoder
    torch.testing.assert_close(trained.z, fp32.z, atol=1e-6, rtol=1e-5)
    quantize_encoder_int8(model, False)
    with torch.no_grad():
        assert torch.equal(prepare(model).encode(src).z, fp32.z), "turning int8 off restores the float32 encoder"


def test_int8_sequence_rows_are_the_decoding_steps_windows():
    """A causal conv_int8_sequence over T steps equals T int8 decoding steps of the same convolution
    (each step's window one row, quantised alike), bit for bit; centred, it equals the causal one
    shifted by the left padding."""
    from convs2s.engine.weights import DerivedWeights, conv_int8_sequence, conv_step

    torch.manual_seed(3)
    conv = DerivedWeights(convs2s.layers.ConvTBCWeight(6, 10, 4).eval())
    conv.use_int8 = True
    x = torch.randn(2, 5, 6)
    with torch.no_grad():
        seq = conv_int8_sequence(conv, x, causal=True, backend="reference")
        state = torch.zeros(2, 3, 6)
        steps = []
        for t in range(5):
            out, state = conv_step(conv, x[:, t], state, None, backend="reference")
            steps.append(out)
        assert torch.equal(seq, torch.stack(steps, 1))
        centred = conv_int8_sequence(conv, x, causal=False, backend="reference")  # k = 4: one step left, two right
        padded = conv_int8_sequence(conv, torch.cat([x, torch.zeros(2, 2, 6)], 1), causal=True, backend="reference")
        assert torch.equal(centred, padded[:, 2:])
        pad_mask = torch.tensor([[False] * 5, [False, False, False, True, True]])
        masked = conv_int8_sequence(conv, x, causal=False, pad_mask=pad_mask, backend="reference")
        zeroed = conv_int8_sequence(conv, x.masked_fill(pad_mask.unsqueeze(-1), 0.0), causal=False, backend="reference")
        assert torch.equal(masked, zeroed), "padded steps' inputs zeroed before the windows"
        assert not torch.equal(masked, centred), "the padded steps' inputs reached the unmasked windows"
        # float activations (linear_int8): conv_glu's ground truth on the dequantised weight
        conv.int8_activations = False
        qweight, scale = conv.int8_weight()
        dequantised = (qweight.double() * scale.double()[:, None]).t().reshape(4, 6, 10)
        want = conv_glu_ref(x.double(), dequantised, conv.bias.double(), causal=False, pad_mask=pad_mask)
        got = conv_int8_sequence(conv, x, causal=False, pad_mask=pad_mask, backend="reference")
        torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=1e-5)
    conv.use_int8 = False
    with pytest.raises(RuntimeError, match="needs int8 on"):
        conv_int8_sequence(conv, x, causal=True)


@pytest.mark.parametrize("variant", ["fp32", "bf16", "int8", "int8-weights-only", "int7"])
def test_one_call_decoder_step_equals_the_layer_loop(variant):
    """The layers of a step in one C++ call give the Python loop's results through beam reorders and
    finished sentences leaving the batch: exactly where both run the same ATen calls (bf16), within
    float rounding where the one-call step runs the float32 attention in its own loop (the same
    hypotheses, scores to 1e-6)."""
    require_or_skip("cpp")
    model = small("custom", **CUSTOM).use_backend("cpp")
    if variant == "bf16":
        model.to(torch.bfloat16)
    quantize_decoder_int8(model, variant.startswith("int"), activations={"int8-weights-only": "float", "int7": "int7"}
                                .get(variant, "int8"))
    sources = [[5, 9, 11, 7], [13, 6, 8, 4], [20, 21, 22, 23], [30, 5, 6, 9]]
    runs = {}
    for one_call in (True, False):
        prepare(model).fused_step = one_call
        runs[one_call] = convs2s.generate(model, sources, beam=3, nbest=3, max_len_b=7, fold_attention=True,
                                          return_attention=True)
    prepare(model).fused_step = True
    exact = variant == "bf16"
    for a, b in zip(runs[True], runs[False]):
        for h, g in zip(a, b):
            assert h["tokens"].tolist() == g["tokens"].tolist()
            if exact:
                assert h["score"] == g["score"]
                assert torch.equal(h["attention"], g["attention"])
            else:
                assert abs(h["score"] - g["score"]) <= 1e-6 * max(1.0, abs(g["score"]))
                torch.testing.assert_close(h["attention"], g["attention"], atol=1e-6, rtol=1e-5)
    with torch.no_grad():
        state = prepare(model).init_decoder_state(prepare(model).encode(torch.tensor([s + [2] for s in sources])), 1, fold_attention=True)
        prepare(model).decode_step(torch.full((4,), 2), state)
    assert state.fused, "the one-call step ran"
