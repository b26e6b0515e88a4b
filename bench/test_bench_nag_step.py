"""``nag_step`` per backend over fconv_iwslt_de_en's parameters (7.9M float32 with Multi30k's
vocabularies), against torch.optim.SGD(nesterov=True)'s own step on the same tensors.
Memory-bound: bytes are a read of parameter, gradient and buffer and a write of parameter and
buffer."""

import pytest
import torch

import convs2s
import convs2s_kernels as ck

from convs2s_bench.harness import record, run_timed


@pytest.mark.parametrize("backend", ["torch", "reference", "cpp"])
def test_nag_step(benchmark, runnable, peaks, device, backend):
    model = convs2s.build_model("fconv_iwslt_de_en", 5665, 5477).to(device)
    params = [p.detach() for p in model.parameters()]
    grads = [torch.randn_like(p) * 1e-3 for p in params]
    bufs = [torch.zeros_like(p) for p in params]
    if backend != "torch":
        runnable(backend, "nag_step", params, grads, bufs)
    benchmark.group = "nag_step fconv_iwslt_de_en float32"
    if backend == "torch":
        leaves = [torch.nn.Parameter(p) for p in params]
        for leaf, g in zip(leaves, grads):
            leaf.grad = g
        opt = torch.optim.SGD(leaves, lr=1e-6, momentum=0.99, nesterov=True)
        run = opt.step
    else:
        def run():
            ck.nag_step(params, grads, bufs, lr=1e-6, momentum=0.99, backend=backend)

    run_timed(benchmark, run, device)
    n = sum(p.numel() for p in params)
    record(benchmark, flops=6.0 * n, bytes_moved=5.0 * 4 * n, peaks=peaks, dtype_name="fp32")
