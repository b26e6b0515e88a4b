"""The decoding engine (``convs2s.engine``) against the model it prepares: the prepared step with
beam reorders, the dispatch of its products on derived weights, the int8 variants (weights, activations,
7-bit) against fp32 and across backends, and the one-call C++ step against the layer loop."""

import pytest
import torch

import convs2s
import convs2s_kernels as ck
from convs2s.architectures import ARCHITECTURES
from convs2s.engine import prepare, quantize_decoder_int8, quantize_encoder_int8
from convs2s.special_tokens import EOS
from convs2s_kernels.ops.conv_glu import conv_glu_ref
from convs2s_kernels.testing import assert_close
from harness import require_or_skip, required_backends
from test_model import CUSTOM, V_TGT, random_batch, small, step_logits


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
