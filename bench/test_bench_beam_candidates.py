"""The beam-search step (``beam_candidates``: log-softmax, the search's rules, each sentence's
top ``2 * beam``) per backend, at the peer workload's shapes: beam 5 over the 8k vocabulary of
fconv_iwslt_de_en and the 40k one of fconv_wmt_en_fr, 1 and 3 sentences per batch (the peer's
27 batches hold 2.4 on average) and 32 (the speed table's batches). The step reads the
``(N, V)`` logits once: the bound is those bytes at the copy bandwidth of that working set."""

import pytest
import torch

import convs2s_kernels as ck

from convs2s_bench.harness import record, run_timed, shapes

SHAPES = shapes(paper=[(b, 5, v) for v in (8000, 40000) for b in (1, 3, 32)], smoke=[(2, 3, 50)])


@pytest.mark.parametrize("shape", [pytest.param(s, id=f"B{s[0]}_beam{s[1]}_V{s[2]}") for s in SHAPES])
@pytest.mark.parametrize("backend", ["reference", "cpp", "triton"])
def test_beam_candidates(benchmark, runnable, peaks, device, backend, shape):
    B, beam, V = shape
    N = B * beam
    logits = torch.randn(N, V, device=device) * 3
    prev = -20 * torch.rand(N, device=device)
    forced = torch.full((N,), 30, device=device)
    ignore = torch.zeros(B, beam, dtype=torch.bool, device=device)
    kwargs = dict(beam=beam, step=7, max_len=40, min_len=1, forced_len=forced, ignore=ignore)
    runnable(backend, "beam_candidates", logits, prev, **kwargs)
    benchmark.group = f"beam_candidates B{B} beam{beam} V{V}"

    def run():
        with torch.no_grad():
            return ck.beam_candidates(logits, prev, backend=backend, **kwargs)

    run_timed(benchmark, run, device)
    # log-softmax's exp and the sum are ~10 FLOPs an entry; the logits are read once
    record(benchmark, flops=10.0 * N * V, bytes_moved=4.0 * N * V, peaks=peaks, dtype_name="fp32",
           working_set_bytes=4 * N * V, device=device)
