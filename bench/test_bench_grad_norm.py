"""``grad_norm`` per backend over fconv_iwslt_de_en's parameters (7.9M float32 with Multi30k's
vocabularies), against ``torch.nn.utils.clip_grad_norm_``'s own norm (``get_total_norm``) on the
same tensors. Memory-bound: bytes are one read of every gradient."""

import pytest
import torch

import convs2s
import convs2s_kernels as ck

from convs2s_bench.harness import record, run_timed


@pytest.mark.parametrize("backend", ["torch", "reference", "cpp"])
def test_grad_norm(benchmark, runnable, peaks, device, backend):
    model = convs2s.build_model("fconv_iwslt_de_en", 5665, 5477).to(device)
    grads = [torch.randn_like(p) * 1e-3 for p in model.parameters()]
    if backend != "torch":
        runnable(backend, "grad_norm", grads)
    benchmark.group = "grad_norm fconv_iwslt_de_en float32"
    if backend == "torch":
        def run():
            return torch.nn.utils.get_total_norm(grads)
    else:
        def run():
            return ck.grad_norm(grads, backend=backend)

    run_timed(benchmark, run, device)
    n = sum(g.numel() for g in grads)
    # the same gradients every round: where their 31 MB fit in the last-level cache, its bandwidth is the limit
    record(benchmark, flops=2.0 * n, bytes_moved=4.0 * n, peaks=peaks, dtype_name="fp32", working_set_bytes=4 * n,
           device=device)
