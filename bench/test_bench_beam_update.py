"""The rest of a beam-search step (``beam_update``: finished hypotheses recorded, every beam
advanced, prefixes gathered by parent) per backend, at the peer workload's shapes: beam 5, 1, 3
and 32 sentences, step 30 of a 60-token limit. Each round runs on fresh copies of the search's
buffers (the op writes them in place); the copies are made outside the timing."""

import pytest
import torch

import convs2s_kernels as ck

from convs2s_bench.harness import record, run_timed, shapes

SHAPES = shapes(paper=[(b, 5) for b in (1, 3, 32)], smoke=[(2, 3)])
STEP, MAX_LEN, V = 30, 60, 8000


def _search(B, k, device):
    g = torch.Generator(device="cpu").manual_seed(B)
    logits = torch.randn(B * k, V, generator=g).to(device)
    logits[:, 2] += 3  # EOS among the candidates
    cands = ck.beam_candidates_ref(logits, -torch.rand(B * k, device=device), beam=k, step=STEP, max_len=MAX_LEN)
    tokens = torch.randint(4, V, (B * k, MAX_LEN + 2), device=device)
    scores = -torch.rand(B * k, MAX_LEN + 1, device=device).cumsum(1)
    return cands, tokens, scores


@pytest.mark.parametrize("shape", [pytest.param(s, id=f"B{s[0]}_beam{s[1]}") for s in SHAPES])
@pytest.mark.parametrize("backend", ["reference", "cpp", "triton"])
def test_beam_update(benchmark, peaks, device, backend, shape):
    B, k = shape
    cands, tokens, scores = _search(B, k, device)
    ignore = torch.zeros(B, k, dtype=torch.bool, device=device)
    sent_ids = torch.arange(B, device=device)
    finished = ck.FinishedHypotheses.empty(B, k, MAX_LEN, device=device)
    why = ck.backend_reasons(backend, "beam_update", device, cands, STEP, tokens, scores, ignore, sent_ids, finished)
    if why:
        pytest.skip(f"{backend} cannot run beam_update here: {'; '.join(why)}")
    benchmark.group = f"beam_update B{B} beam{k}"

    def setup():  # fresh buffers each round: the op advances them in place
        return (cands, STEP, tokens.clone(), scores.clone(), ignore, sent_ids,
                ck.FinishedHypotheses(*(t.clone() for t in finished[:6]), None)), dict(backend=backend)

    with torch.no_grad():
        benchmark.pedantic(ck.beam_update, setup=setup, rounds=50,
                           warmup_rounds=1)
    # the prefixes of every row are gathered (tokens and scores) and written back
    moved = B * k * (STEP + 1) * (8 + 4) * 2
    record(benchmark, flops=0.0, bytes_moved=float(moved), peaks=peaks, dtype_name="fp32")
