"""``dropout`` per backend at the training's shapes (fconv_iwslt_de_en at 2,000 tokens: 2,000 x 256
activations; fconv_wmt_en_de at 4,000: 4,000 x 512), forward and backward, against what
``torch.nn.functional.dropout`` (a Bernoulli mask drawn from torch's generator) takes for the
same tensor. Memory-bound: bytes are one read and one write of the tensor each way."""

import pytest
import torch

import convs2s_kernels as ck

from convs2s_bench.harness import record, run_timed

SHAPES = [(2000, 256), (4000, 512)]


@pytest.mark.parametrize("shape", [pytest.param(s, id=f"{s[0]}x{s[1]}") for s in SHAPES])
@pytest.mark.parametrize("backend", ["torch", "reference", "cpp"])
def test_dropout(benchmark, runnable, peaks, device, backend, shape):
    x = torch.randn(*shape, device=device, requires_grad=True)
    if backend != "torch":
        runnable(backend, "dropout", x)
    benchmark.group = f"dropout {shape[0]}x{shape[1]} float32"

    def run():
        y = torch.nn.functional.dropout(x, 0.2, True) if backend == "torch" else ck.dropout(x, 0.2, backend=backend)
        y.backward(torch.ones_like(y))
        return y

    run_timed(benchmark, run, device)
    record(benchmark, flops=2.0 * x.numel(), bytes_moved=4.0 * x.numel() * x.element_size(), peaks=peaks,
           dtype_name="fp32")
