"""The ConvS2S model: fairseq equivalence, incremental decoding, padding, init, sizes and errors."""

import math
import os
from pathlib import Path

import pytest
import torch

import convs2s
from convs2s.architectures import ARCHITECTURES, ConfigError, UnknownOptionError, parse_layer_spec
from convs2s.special_tokens import EOS, PAD
from convs2s.engine import prepare

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


