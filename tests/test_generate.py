"""Greedy and beam search: beam 1 = greedy, rescoring, ordering, batching invariance, errors."""

import math

import pytest
import torch

import convs2s
from convs2s.special_tokens import EOS, PAD
from convs2s.generate import GenerationError, length_batches
from convs2s.engine import quantize_decoder_int8, quantize_encoder_int8

V_SRC, V_TGT = 30, 33


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(7)
    m = convs2s.build_model("fconv_iwslt_de_en", V_SRC, V_TGT, encoder_layers="[(64, 3)] * 2",
                            decoder_layers="[(64, 3)] * 2", encoder_embed_dim=32, decoder_embed_dim=32,
                            decoder_out_embed_dim=32).eval()
    with torch.no_grad():  # peaked output distributions keep choices away from ties
        m.decoder.fc3.weight_g.mul_(6)
    return m


def sources(n=9, seed=0):
    g = torch.Generator().manual_seed(seed)
    lengths = [3, 7, 3, 5, 7, 1, 5, 3, 9][:n]
    return [torch.randint(4, V_SRC, (L,), generator=g).tolist() for L in lengths]


def test_beam1_equals_greedy(model):
    src = sources()
    beam = convs2s.generate(model, src, beam=1, max_len_a=1.5, max_len_b=4)
    greedy = convs2s.greedy(model, src, max_len_a=1.5, max_len_b=4)
    for b, g in zip(beam, greedy):
        assert b[0]["tokens"].tolist() == g["tokens"].tolist()
        assert abs(b[0]["score"] - g["score"]) < 1e-5


@pytest.mark.parametrize("lenpen", [1.0, 0.5])
def test_scores_equal_rescoring_with_full_forward(model, lenpen):
    """Every n-best hypothesis rescored by the full-sequence forward gives its positional scores,
    and its score is their sum divided by length ** lenpen."""
    src = sources(5)
    out = convs2s.generate(model, src, beam=4, nbest=4, max_len_a=1.0, max_len_b=5, lenpen=lenpen)
    for s, hyps in zip(src, out):
        assert len(hyps) == 4
        assert all(hyps[i]["score"] >= hyps[i + 1]["score"] for i in range(3))
        for h in hyps:
            toks = h["tokens"]
            assert toks[-1] == EOS and (toks[:-1] != EOS).all() and (toks != PAD).all()
            src_t = torch.tensor([s + [EOS]])
            prev = torch.cat([torch.tensor([EOS]), toks[:-1]]).unsqueeze(0)
            with torch.no_grad():
                lprobs = torch.log_softmax(model(src_t, None, prev)[0].float(), -1)[0]
            pos = lprobs.gather(1, toks.unsqueeze(1)).squeeze(1)
            torch.testing.assert_close(h["positional_scores"], pos, atol=1e-4, rtol=0)
            assert abs(h["score"] - pos.sum().item() / len(toks) ** lenpen) < 1e-4


def test_beam_search_finds_known_best_sequence():
    """Hand-set weights: the logits depend only on the target position, through a residual path
    (convolutions and attention zeroed), so the best sequence is the per-position argmax chain."""
    E = 16
    m = convs2s.build_model("fconv_iwslt_de_en", V_SRC, V_TGT, encoder_layers="[(E, 3)]".replace("E", str(E)),
                            decoder_layers=f"[({E}, 3)]", encoder_embed_dim=E, decoder_embed_dim=E,
                            decoder_out_embed_dim=E, dropout=0.0, weight_norm=False).eval()
    best = [7, 9, 11, EOS]
    table = torch.full((len(best), V_TGT), -5.0)
    for t, tok in enumerate(best):
        table[t, tok] = 5.0
        table[t, (tok + 1) % V_TGT] = 4.0  # a strong runner-up, so the beam has real choices
    dec = m.decoder
    with torch.no_grad():
        for p in dec.parameters():
            p.zero_()
        dec.embed_positions.weight[PAD + 1 : PAD + 1 + len(best), : len(best)] = torch.eye(len(best))
        dec.fc1.weight.copy_(torch.eye(E))
        dec.fc2.weight.copy_(torch.eye(E))
        dec.fc3.weight[:, : len(best)] = table.t()
    out = convs2s.generate(m, [[5, 6]], beam=3, nbest=3, max_len_b=len(best) + 3)
    top = out[0][0]
    assert top["tokens"].tolist() == best
    # After the residual block the position signal is scaled by sqrt(1/2): logits = table[t] * sqrt(1/2).
    lp = torch.log_softmax(table * math.sqrt(0.5), -1)
    want = torch.stack([lp[t, tok] for t, tok in enumerate(best)])
    torch.testing.assert_close(top["positional_scores"], want, atol=1e-5, rtol=0)
    assert abs(top["score"] - want.sum().item() / len(best)) < 1e-5
    assert all(h["score"] < top["score"] for h in out[0][1:])


def test_results_in_input_order_and_batch_invariant(model):
    src = sources()
    kw = dict(beam=3, nbest=2, max_len_a=1.0, max_len_b=4)
    together = convs2s.generate(model, src, **kw)
    for i in (0, 5, 8):
        alone = convs2s.generate(model, [src[i]], **kw)[0]
        for a, b in zip(alone, together[i]):
            assert a["tokens"].tolist() == b["tokens"].tolist()
            assert abs(a["score"] - b["score"]) < 1e-5
    small_batches = convs2s.generate(model, src, batch_size=1, **kw)
    for a, b in zip(small_batches, together):
        assert a[0]["tokens"].tolist() == b[0]["tokens"].tolist()


def test_min_and_max_len_and_unk_penalty(model):
    src = sources(4)
    out = convs2s.generate(model, src, beam=2, max_len_a=0, max_len_b=3, min_len=2)
    for hyps in out:
        n = len(hyps[0]["tokens"])
        assert 3 <= n <= 4  # at least min_len tokens before EOS, at most max_len + EOS
    no_unk = convs2s.generate(model, src, beam=2, max_len_b=6, unkpen=1e4)
    assert all(3 not in h[0]["tokens"].tolist() for h in no_unk)


def test_attention_and_alignment(model):
    out = convs2s.generate(model, [[4, 5, 6, 7]], beam=2, max_len_b=5, return_attention=True)
    h = out[0][0]
    assert h["attention"].shape == (5, len(h["tokens"]))  # source incl. EOS x target incl. EOS
    torch.testing.assert_close(h["attention"].sum(0), torch.ones(len(h["tokens"])), atol=1e-5, rtol=0)
    assert h["alignment"].tolist() == h["attention"].argmax(0).tolist()


def test_length_batches():
    assert length_batches([3, 5, 3, 3, 5], batch_size=2) == [[0, 2], [3], [1, 4]]
    assert length_batches([4, 4, 4], batch_size=128, max_tokens=8) == [[0, 1], [2]]


@pytest.mark.parametrize(
    "kwargs,srcs,match",
    [
        (dict(beam=2, nbest=3), [[5]], "nbest <= beam"),
        (dict(), [[5, V_SRC + 3]], "outside the vocabulary"),
        (dict(), [list(range(4, 10)) * 200], "at most 1021"),
        (dict(batch_size=0), [[5]], "batch_size"),
        (dict(), [[5, 1, 6]], "source 0 holds a special symbol's id"),  # a PAD inside
        (dict(), [[5, 6], [7, 2, 8]], "source 1 holds a special symbol's id"),  # an EOS inside
    ],
)
def test_generate_bad_input(model, kwargs, srcs, match):
    with pytest.raises(GenerationError, match=match):
        convs2s.generate(model, srcs, **kwargs)


@pytest.mark.parametrize("beam", [1, 4])
def test_folded_attention_gives_the_same_hypotheses_and_attention(model, beam):
    """Equal-length sources finish at different steps, so the folded state is also shrunk."""
    g = torch.Generator().manual_seed(5)
    src = [torch.randint(4, V_SRC, (6,), generator=g).tolist() for _ in range(7)] + sources()
    forced = [3, 8, 5, 11, 4, 6, 9] + [None] * len(sources())  # different end steps within the batch
    kw = dict(beam=beam, nbest=beam, max_len_a=1.5, max_len_b=4, return_attention=True)
    plain = convs2s.generate(model, src, **kw)
    folded = convs2s.generate(model, src, fold_attention=True, **kw)
    hooks = convs2s.Observer(forced_length=forced[:7])
    plain_forced = convs2s.generate(model, src[:7], observer=hooks, **kw)
    folded_forced = convs2s.generate(model, src[:7], fold_attention=True, observer=hooks, **kw)
    assert [len(h[0]["tokens"]) for h in plain_forced] == [f + 1 for f in forced[:7]]
    plain, folded = plain + plain_forced, folded + folded_forced
    for p, f in zip(plain, folded):
        for hp, hf in zip(p, f):
            assert hp["tokens"].tolist() == hf["tokens"].tolist()
            assert abs(hp["score"] - hf["score"]) < 1e-4
            torch.testing.assert_close(hf["attention"], hp["attention"], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("beam", [1, 3, 5])
def test_native_search_step_gives_the_reference_search(model, beam):
    """The cpp search step (convs2s_kernels.beam_candidates and beam_update) and the reference
    step (fairseq's, tensor op by tensor op) choose the same n-best lists with the same scores and
    attention, bit for bit, with the decoder unchanged: every rule (min length, UNK penalty, forced
    lengths ending at different steps, max length) in play, sentences leaving the batch early."""
    import convs2s_kernels as ck
    from harness import require_or_skip

    require_or_skip("cpp")
    g = torch.Generator().manual_seed(11)
    src = [torch.randint(4, V_SRC, (6,), generator=g).tolist() for _ in range(6)] + sources()
    forced = [3, 8, 5, 11, 4, 6] + [2] * len(sources())
    kw = dict(beam=beam, nbest=beam, max_len_a=1.0, max_len_b=5, min_len=2, unkpen=0.3, lenpen=0.7)
    ops = ("beam_candidates", "beam_update")
    runs = {}
    for backend in ("reference", "cpp"):
        on = convs2s.Observer(search_backend=backend)
        forcing = convs2s.Observer(search_backend=backend, forced_length=forced)
        with ck.count_dispatches() as counts:
            runs[backend] = (convs2s.generate(model, src, observer=on, **kw)
                             + convs2s.generate(model, src, observer=forcing, **kw)
                             + convs2s.generate(model, src[:4], return_attention=True, observer=on, **kw))
        for op in ops:
            assert counts[(op, backend)] > 0 and len([key for key in counts if key[0] == op]) == 1
        assert counts[("decoder_step", "cpp")] == 0  # this small model runs the plain decoder on auto
    for ref, native in zip(runs["reference"], runs["cpp"]):
        assert len(ref) == len(native) == beam
        for a, b in zip(ref, native):
            assert a["tokens"].tolist() == b["tokens"].tolist()
            assert a["score"] == b["score"] and torch.equal(a["positional_scores"], b["positional_scores"])
            assert ("attention" in a) == ("attention" in b)
            if "attention" in a:
                assert torch.equal(a["attention"], b["attention"])


def test_search_step_runs_native_by_default(model):
    """On a CPU with the extension, generate's search step runs the cpp ops (auto's choice)."""
    import convs2s_kernels as ck
    from harness import require_or_skip

    require_or_skip("cpp")
    with ck.count_dispatches() as counts:
        convs2s.generate(model, sources(3), beam=2, max_len_b=4)
    for op in ("beam_candidates", "beam_update"):
        assert counts[(op, "cpp")] > 0 and counts[(op, "reference")] == 0


@pytest.mark.parametrize("fold", [False, True])
def test_decoding_under_bf16_autocast_matches_the_reference_backend(model, fold):
    """Under bf16 autocast the ops cast their weights to bf16, so the cpp step must not be handed
    the float32 packed weights (``step_packed``): the cpp and reference backends decode alike."""
    from harness import require_or_skip

    require_or_skip("cpp")
    src = sources(5)
    kw = dict(beam=3, nbest=3, max_len_a=1.0, max_len_b=4, fold_attention=fold)
    runs = {}
    try:
        for backend in ("reference", "cpp"):
            model.use_backend(backend)
            with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
                runs[backend] = convs2s.generate(model, src, **kw)
    finally:
        model.use_backend(None)
    same = 0
    for ref, native in zip(runs["reference"], runs["cpp"]):
        assert len(ref) == len(native) == 3
        # bf16 rounds differently in the backends' summation orders: a near tie may pick another
        # hypothesis, so the best scores agree to bf16 precision and most top-1 lists are identical
        assert abs(ref[0]["score"] - native[0]["score"]) < 0.05
        same += ref[0]["tokens"].tolist() == native[0]["tokens"].tolist()
    assert same >= len(src) - 1


@pytest.mark.parametrize("weights", ["fp32", "int8", "w7a7"])
@pytest.mark.parametrize("fold", [False, True])
def test_decoding_under_inference_mode_equals_no_grad(weights, fold):
    """``torch.inference_mode()`` tensors keep no version counter: the model's derived copies
    (weight norm, packings, int8 weights) and the ops' once-per-tensor checks are made and found
    inside it, decode exactly as under ``no_grad`` on every backend, and an in-place weight update
    made afterwards is still seen."""
    import convs2s_kernels as ck

    torch.manual_seed(3)
    m = convs2s.build_model("fconv_iwslt_de_en", V_SRC, V_TGT, encoder_layers="[(64, 3)] * 2",
                            decoder_layers="[(64, 3)] * 2", encoder_embed_dim=32, decoder_embed_dim=32,
                            decoder_out_embed_dim=32).eval()
    if weights != "fp32":
        quantize_decoder_int8(m, activations="int7" if weights == "w7a7" else "int8",
                                weight_bits=7 if weights == "w7a7" else 8)
        quantize_encoder_int8(m, activations="int8")
    src = sources(5)
    kw = dict(beam=3, nbest=3, max_len_a=1.0, max_len_b=4, fold_attention=fold)
    backends = [b for b in ("reference", "cpp") if ck.available_backends()[b] is None]
    assert "reference" in backends
    for backend in backends:
        m.use_backend(backend)
        for update in range(2):
            with torch.inference_mode():
                inside = convs2s.generate(m, src, **kw)
            with torch.no_grad():
                outside = convs2s.generate(m, src, **kw)
                m.decoder.fc3.weight_g.mul_(3)  # seen by the next round's copies
            for a, b in zip(inside, outside):
                assert [h["tokens"].tolist() for h in a] == [h["tokens"].tolist() for h in b]
                assert [h["score"] for h in a] == [h["score"] for h in b]
            if update == 0:
                first = inside
        assert [h[0]["score"] for h in first] != [h[0]["score"] for h in inside], "the weight update went unseen"
    m.use_backend(None)
    # the copies made inside inference mode are ordinary tensors: a frozen layer's weight, later saved for backward
    fc = m.decoder.fc2
    fc.requires_grad_(False)
    with torch.inference_mode():
        w = fc.effective_weight()
    assert not w.is_inference()
    x = torch.randn(3, fc.in_features, requires_grad=True)
    torch.nn.functional.linear(x, fc.effective_weight()).sum().backward()
    assert x.grad is not None and x.grad.abs().sum() > 0


def test_a_model_built_under_inference_mode_says_its_weights_cannot_change(monkeypatch):
    """Parameters made under inference_mode keep no version counter, so the cached copies could not
    see an in-place write: one warning says so (and the model still decodes)."""
    import convs2s.layers as layers

    monkeypatch.setattr(layers, "_WARNED_INFERENCE_PARAMETERS", False)
    with torch.inference_mode():
        m = convs2s.build_model("fconv_iwslt_de_en", V_SRC, V_TGT, encoder_layers="[(64, 3)] * 1",
                                decoder_layers="[(64, 3)] * 1", encoder_embed_dim=32, decoder_embed_dim=32,
                                decoder_out_embed_dim=32).eval()
        with pytest.warns(UserWarning, match="parameters are inference tensors") as caught:
            out = convs2s.generate(m, sources(2), beam=2, max_len_b=3)
    assert len(out) == 2 and len([w for w in caught if "inference tensors" in str(w.message)]) == 1


def test_search_options_are_one_value_and_hooks_an_observer(model):
    """generate takes its options as one SearchOptions (or any of its fields as keywords, the same
    search); a measurement hook or an unknown name among them is refused in one line."""
    src = sources(5)
    a = convs2s.generate(model, src, convs2s.SearchOptions(beam=3, nbest=2, max_len_b=6))
    b = convs2s.generate(model, src, beam=3, nbest=2, max_len_b=6)
    c = convs2s.generate(model, src, convs2s.SearchOptions(beam=2), beam=3, nbest=2, max_len_b=6)  # fields win
    for x, y, z in zip(a, b, c):
        assert [h["tokens"].tolist() for h in x] == [h["tokens"].tolist() for h in y] == [h["tokens"].tolist() for h in z]
    steps = []
    convs2s.generate(model, [[5, 6, 7]] * 2, beam=2, max_len_b=6, observer=convs2s.Observer(on_step=steps.append))
    assert steps[0] == -1 and steps[1:] == list(range(len(steps) - 1))  # one batch: encoded, then each step
    with pytest.raises(TypeError, match=r"unknown search option\(s\) forced_length: .*observer=Observer"):
        convs2s.generate(model, src, forced_length=[3] * 5)
    with pytest.raises(TypeError, match=r"unknown search option\(s\) beams: choose from "):
        convs2s.generate(model, src, beams=3)


def test_a_model_has_one_preparation_and_a_copy_prepares_anew(model):
    """prepare(model) is the same object each time (its derived weights reused by every generate);
    a deep copy of the model starts without the original's int8 setting or copies."""
    import copy

    from convs2s.engine import PreparedModel, prepare

    p = prepare(model)
    with pytest.raises(ValueError, match="unknown compute type 'fp16'; choose from fp32, bf16, "):
        prepare(model, "fp16")
    assert isinstance(p, PreparedModel) and prepare(model) is p and prepare(p) is p and p.model is model
    quantize_decoder_int8(model)
    try:
        twin = copy.deepcopy(model)
        assert prepare(twin) is not p and prepare(twin).model is twin
        assert not prepare(twin).derived(twin.decoder.fc1).use_int8 and p.derived(model.decoder.fc1).use_int8
    finally:
        quantize_decoder_int8(model, False)
