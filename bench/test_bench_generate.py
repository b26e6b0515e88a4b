"""Whole-model generation (encoder + incremental beam search) per backend, beam and dtype.

Paper shape: the WMT'14 En-Fr model (``fconv_wmt_en_fr``, 40K vocabularies, random weights with a
fixed seed) translating one batch of 8 equal-length sentences of 23 tokens (newstest's mean),
output forced to 25 tokens, so every backend does the same work. The extra_info holds the
generation's FLOPs and its fraction of the GEMM peak measured in the same session.
"""

import pytest
import torch

import convs2s
from convs2s_bench.flops import decoder_step_bytes, generation_flops

from convs2s_bench.harness import DTYPES, SMOKE, record, shapes
from convs2s.engine import prepare, quantize_decoder_int8

ARCH, VOCAB, SENTENCES, LENGTH = shapes(paper=("fconv_wmt_en_fr", 40000, 8, 23), smoke=("fconv_iwslt_de_en", 64, 2, 4))
FORCED = round(1.1 * LENGTH)
# the smoke run narrows the layers so the Triton interpreter gets through a whole generation quickly
OVERRIDES = shapes(paper={}, smoke=dict(encoder_embed_dim=32, decoder_embed_dim=32, decoder_out_embed_dim=32,
                                         encoder_layers="[(32, 3)] * 2", decoder_layers="[(32, 3)] * 2"))


@pytest.fixture(scope="module")
def models(device):
    torch.manual_seed(1)
    fp32 = convs2s.build_model(ARCH, VOCAB, VOCAB, **OVERRIDES).fold_weight_norm().eval().to(device)
    cache = {"fp32": fp32}

    def get(dtype_name):
        if dtype_name not in cache:
            cache[dtype_name] = convs2s.build_model(ARCH, VOCAB, VOCAB, **OVERRIDES).fold_weight_norm().eval().to(device)
            cache[dtype_name].load_state_dict(fp32.state_dict())
            cache[dtype_name].to(DTYPES[dtype_name])
        return cache[dtype_name]

    return get


@pytest.mark.parametrize("dtype_name", list(DTYPES))
@pytest.mark.parametrize("beam", [1, 5])
@pytest.mark.parametrize("backend", ["reference", "cpp", "triton"])
def test_generate(benchmark, runnable, peaks, device, models, backend, beam, dtype_name):
    model = models(dtype_name)
    x = torch.zeros(1, 1, 8, device=device, dtype=DTYPES[dtype_name])
    runnable(backend, "conv_step", x[0], x.expand(1, 2, 8), torch.zeros(3, 8, 16, device=device, dtype=x.dtype))
    g = torch.Generator().manual_seed(2)
    sources = [torch.randint(4, VOCAB, (LENGTH,), generator=g).tolist() for _ in range(SENTENCES)]
    model.use_backend(backend)
    benchmark.group = f"generate {ARCH} {SENTENCES}x{LENGTH} tokens beam {beam} {dtype_name}"

    def run():
        return convs2s.generate(model, sources, beam=beam, max_len_a=1.2, max_len_b=10,
                                observer=convs2s.Observer(forced_length=[FORCED] * SENTENCES))

    try:
        hyps = run()  # warm-up outside the rounds
        benchmark.pedantic(run, rounds=1 if SMOKE else 3, iterations=1)
    finally:
        model.use_backend(None)
    tokens = [len(h[0]["tokens"]) for h in hyps]
    assert tokens == [FORCED + 1] * SENTENCES  # the forced length held: equal work for every backend
    benchmark.extra_info["target_tokens"] = sum(tokens)
    record(benchmark, flops=generation_flops(model, [LENGTH] * SENTENCES, tokens, beam),
           bytes_moved=streamed_bytes(model, FORCED + 1), peaks=peaks, dtype_name=dtype_name,
           working_set_bytes=decoder_step_bytes(model), device=device)


def streamed_bytes(model, steps, vocab_rows=None):
    """The encoder's weights once, the decoder's at their stored dtype (int8 where quantised, the
    shortlist's rows of the output layer) at every step; embeddings are gathered rows."""
    encoder = sum(p.numel() * p.element_size() for n, p in model.encoder.named_parameters()
                  if p.dim() >= 2 and "embed_" not in n)
    return encoder + steps * decoder_step_bytes(model, vocab_rows)


# One sentence at a time (interactive use), the decoder options of the CPU path side by side:
# (backend, decoder folded, int8 weights, shortlist, layers in one C++ call). The first is the
# baseline of the ratios; "loop" runs the layers from Python (the one-call step turned off).
CONFIGS = {
    "reference-plain-fp32-full": ("reference", False, False, False, False),
    "cpp-folded-fp32-full-loop": ("cpp", True, False, False, False),
    "cpp-folded-fp32-full": ("cpp", True, False, False, True),
    "cpp-folded-int8-full-loop": ("cpp", True, True, False, False),
    "cpp-folded-int8-full": ("cpp", True, True, False, True),
    "cpp-folded-fp32-shortlist": ("cpp", True, False, True, True),
    "cpp-folded-int8-shortlist": ("cpp", True, True, True, True),
}
SHORTLIST_TOP = shapes(paper=2000, smoke=20)  # most frequent target words kept, plus each source word's list


@pytest.mark.parametrize("beam", [1, 5])
@pytest.mark.parametrize("provider", list(CONFIGS))
def test_generate_one_sentence(benchmark, runnable, peaks, device, models, provider, beam):
    from convs2s.shortlist import Shortlist

    backend, fold, int8, use_shortlist, one_call = CONFIGS[provider]
    model = models("fp32")
    x = torch.zeros(1, 8, device=device)
    if int8:  # quantize_decoder_int8's default: int8 activations too, linear_w8a8
        runnable(backend, "linear_w8a8", x, torch.zeros(4, 8, dtype=torch.int8, device=device), torch.ones(4, device=device))
    else:
        runnable(backend, "conv_step", x, torch.zeros(1, 2, 8, device=device), torch.zeros(3, 8, 16, device=device))
    g = torch.Generator().manual_seed(3)
    source = [torch.randint(4, VOCAB, (LENGTH,), generator=g).tolist()]
    # a lexical table of 20 candidates per source word, as a word-alignment dictionary would give
    table = {s: torch.randint(4, VOCAB, (20,), generator=g).tolist() for s in source[0]}
    shortlist = Shortlist(table, VOCAB, top=SHORTLIST_TOP) if use_shortlist else None
    quantize_decoder_int8(model.use_backend(backend), int8)
    prepare(model).fused_step = one_call
    benchmark.group = f"generate one sentence {ARCH} {LENGTH} tokens beam {beam}"

    def run():
        return convs2s.generate(model, source, beam=beam, max_len_a=1.2, max_len_b=10, fold_attention=fold,
                                shortlist=shortlist, observer=convs2s.Observer(forced_length=[FORCED]))

    vocab_rows = int(shortlist.candidates(torch.tensor(source)).numel()) if shortlist else VOCAB
    try:
        hyps = run()
        benchmark.pedantic(run, rounds=1 if SMOKE else 3, iterations=1)
        # the bytes the timed runs streamed, counted while the decoder is still quantised
        step_bytes, moved = decoder_step_bytes(model, vocab_rows), streamed_bytes(model, FORCED + 1, vocab_rows)
    finally:  # the module's shared model back to float32 and the reference, whatever happened
        quantize_decoder_int8(model.use_backend(None), False)
        prepare(model).fused_step = True
    tokens = [len(h[0]["tokens"]) for h in hyps]
    assert tokens == [FORCED + 1]
    benchmark.extra_info["target_tokens"] = sum(tokens)
    benchmark.extra_info["vocabulary"] = vocab_rows
    record(benchmark, flops=generation_flops(model, [LENGTH], tokens, beam), bytes_moved=moved, peaks=peaks,
           dtype_name="int8" if int8 else "fp32", working_set_bytes=step_bytes, device=device)
