"""The whole model on the Triton backend against the reference backend.

Without a GPU this runs the kernels in the Triton interpreter (tests/conftest.py sets
``TRITON_INTERPRET=1``), so the model is small. The dispatcher's counts prove the Triton
kernels, not the reference fallback, did the work.
"""

import pytest
import torch

import convs2s
import convs2s_kernels as ck
from convs2s.special_tokens import EOS
from harness import require_or_skip
from test_model import CUSTOM, V_TGT, random_batch, small
from convs2s.engine import prepare

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


class TritonCalls:
    """The calls the dispatcher sent to the Triton backend, per op."""

    def __init__(self, counts):
        self.counts = counts

    def get(self, op: str, default: int = 0) -> int:
        return self.counts.get((op, "triton"), default)


@pytest.fixture
def triton_calls():
    """Counts the calls each op makes into the Triton backend; skips (or fails, when required)
    when it cannot run here."""
    require_or_skip("triton")
    with ck.count_dispatches() as counts:
        yield TritonCalls(counts)


def _model():
    """Narrow layers (16-32 channels) with k = 1..7, width-changing projections, attention in
    some layers: every code path of the decoder at a size the interpreter runs quickly."""
    return small("custom", **CUSTOM).to(DEVICE)


def test_full_forward_and_gradients_equal_reference(triton_calls):
    model = _model()
    src, prev = (t.to(DEVICE) for t in random_batch(3, 7, 6, lengths=[7, 2, 5]))
    results = {}
    for backend in ("reference", "triton"):
        model.zero_grad()
        model.use_backend(backend)
        logits, attn = model(src, None, prev)
        logits.log_softmax(-1).mean().backward()
        results[backend] = (logits.detach(), attn.detach(),
                            {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
    model.use_backend(None)
    assert triton_calls.get("conv_glu", 0) >= 10 and triton_calls.get("attention_embsum", 0) >= 1
    (ref_logits, ref_attn, ref_grads), (tri_logits, tri_attn, tri_grads) = results["reference"], results["triton"]
    torch.testing.assert_close(tri_logits, ref_logits, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(tri_attn, ref_attn, atol=1e-6, rtol=1e-4)
    assert set(tri_grads) == set(ref_grads)
    for name, g in ref_grads.items():
        torch.testing.assert_close(tri_grads[name], g, atol=1e-6, rtol=1e-3, msg=lambda m: f"grad of {name}: {m}")


def test_decoder_steps_with_beam_reorder_equal_reference(triton_calls):
    """Full decoder steps (conv step, attention, projections) with repeated parents, both backends."""
    model = _model()
    B, beam, steps = 2, 3, 4
    src, _ = random_batch(B, 6, 1, lengths=[6, 3])
    src = src.to(DEVICE)
    gen = torch.Generator().manual_seed(5)
    plan = []
    for _ in range(steps):
        parents = torch.randint(0, beam, (B, beam), generator=gen)
        parents[:, 1] = parents[:, 0]
        plan.append(((parents + torch.arange(B).unsqueeze(1) * beam).view(-1).to(DEVICE),
                     torch.randint(4, V_TGT, (B * beam,), generator=gen).to(DEVICE)))
    outputs = {}
    with torch.no_grad():
        for backend in ("reference", "triton"):
            model.use_backend(backend)
            state = prepare(model).init_decoder_state(prepare(model).encode(src), beam)
            tokens = torch.full((B * beam,), EOS, dtype=torch.long, device=DEVICE)
            logits_seq = []
            for parents, next_tokens in plan:
                logits, attn = prepare(model).decode_step(tokens, state, need_attn=True)
                logits_seq.append((logits, attn))
                state.reorder(parents)
                tokens = next_tokens
            outputs[backend] = logits_seq
    model.use_backend(None)
    assert triton_calls.get("conv_step", 0) >= steps
    for (rl, ra), (tl_, ta) in zip(outputs["reference"], outputs["triton"]):
        torch.testing.assert_close(tl_, rl, atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(ta, ra, atol=1e-6, rtol=1e-4)


@pytest.mark.parametrize("beam", [1, 3])
def test_generation_equals_reference(triton_calls, beam):
    model = _model()
    sources = [[5, 9, 11, 7], [13, 6, 8]]
    hyps = {}
    for backend in ("reference", "triton"):
        model.use_backend(backend)
        hyps[backend] = convs2s.generate(model, sources, beam=beam, max_len_b=6)
    model.use_backend(None)
    assert triton_calls.get("conv_step", 0) > 0
    for ref, tri in zip(hyps["reference"], hyps["triton"]):
        assert [h["tokens"].tolist() for h in tri] == [h["tokens"].tolist() for h in ref]
        for a, b in zip(tri, ref):
            assert abs(float(a["score"]) - float(b["score"])) < 1e-4


@pytest.fixture
def autotune_keys(monkeypatch):
    """Every (kernel, autotune key, specialisation) a Triton autotuner is asked for: the key as
    Triton computes it (the key's arguments, then the dtypes of the tensors), whether or not it has
    several configs, and what Triton compiles a kernel anew for (each integer argument equal to 1,
    divisible by 16 or neither; each tensor's address 16-byte aligned or not)."""
    from triton.runtime.autotuner import Autotuner

    from convs2s_kernels.buckets import specialization

    keys = []
    run = Autotuner.run

    def recording_run(self, *args, **kwargs):
        named = {**dict(zip(self.arg_names, args)), **{k: v for k, v in kwargs.items() if k in self.arg_names}}
        key = tuple(named[k] for k in self.keys if k in named)
        key += tuple(str(v.dtype) for v in named.values() if hasattr(v, "dtype"))
        spec = tuple(specialization(v) if isinstance(v, int) and not isinstance(v, bool)
                     else v.data_ptr() % 16 == 0 if isinstance(v, torch.Tensor) else None for v in named.values())
        keys.append((self.base_fn.__name__, key, spec))
        return run(self, *args, **kwargs)

    monkeypatch.setattr(Autotuner, "run", recording_run)
    return keys


def _warmup_model():
    # channels in multiples of 16, as every fconv architecture has (they keep strides in one class)
    model = small("custom", encoder_embed_dim=16, decoder_embed_dim=16, decoder_out_embed_dim=16,
                  encoder_layers="[(16, 3)] * 2 + [(32, 1)]", decoder_layers="[(16, 3), (32, 2), (32, 1)]",
                  decoder_attention="True").to(DEVICE)
    return model.use_backend("triton")


# lengths 2-20 (EOS included: 3-21), two of them past the first bucket (16), in batches of 1 to 16
WARMUP_SOURCES = [[5] * 2, [6] * 15, [6] * 15, [7] * 19] + [[8] * 20] * 2 + [[9] * 10] * 16


@pytest.mark.parametrize("fold", [False, True], ids=["plain", "folded_attention"])
def test_warmup_tunes_every_key_decoding_meets(triton_calls, autotune_keys, fold, monkeypatch):
    """After ``warmup`` up to a source length, decoding sentences of any length up to it, in
    batches of any size, asks the autotuners for no key and Triton for no specialisation they have
    not seen: no tuning or compiling (seconds on a GPU) inside a timing. (Issue 58: sources up to
    21 tokens, the smallest range with two length buckets; each attention form on its own.) The
    check can fail: the keys the same warm-up met before its first 21-token sources (what a
    warm-up to 16 tokens runs, lengths ascending) miss the longer bucket."""

    started = {}  # source length -> keys recorded before the warm-up's first run at it
    real = ck.warmup

    def marking(run, **kw):
        def marked(S, sentences):
            started.setdefault(S, len(autotune_keys))
            return run(S, sentences)
        return real(marked, **kw)
    monkeypatch.setattr(ck, "warmup", marking)
    model = _warmup_model()
    assert convs2s.warmup(model, max_source_length=21, beam=2, fold_attention=fold) == [1, 15, 16, 21]
    warmed = set(autotune_keys)
    up_to_16 = set(autotune_keys[:started[21]])
    autotune_keys.clear()
    convs2s.generate(model, WARMUP_SOURCES, beam=2, max_len_b=4, fold_attention=fold)
    met = set(autotune_keys)
    assert triton_calls.get("conv_step") > 0 and met, "the decoding ran no Triton autotuner"
    assert met <= warmed, f"met only while decoding: {sorted(met - warmed)}"
    assert ck.buckets.warmup_lengths(16) == [1, 15, 16] and not met <= up_to_16
    with pytest.raises(ValueError, match="drop max_len_b"):
        convs2s.warmup(model, max_source_length=16, max_len_b=3)


def test_warmup_covers_every_bucket_and_specialization():
    from convs2s_kernels import buckets
    from convs2s_kernels.triton_common import config

    assert all(buckets.bucket(n) == config.bucket(n) for n in range(1, 5000))
    pairs = lambda sizes: {(config.bucket(n), buckets.specialization(n)) for n in sizes}  # noqa: E731
    for smallest in (1, 7):
        for largest in range(smallest, 1100):
            lengths = buckets.warmup_lengths(largest, smallest)
            assert lengths[-1] == largest and len(pairs(lengths)) == len(lengths)
            assert pairs(lengths) == pairs(range(smallest, largest + 1))
    with pytest.raises(ValueError, match="need 1 <= smallest <= largest"):
        buckets.warmup_lengths(0)
