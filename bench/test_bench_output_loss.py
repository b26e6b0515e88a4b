"""``output_loss`` per backend: the output projection and the label-smoothed loss, forward and
backward, at the training's shapes (fconv_iwslt_de_en on Multi30k: 2,000 rows x 256 -> 5,477
words; fconv_wmt_en_de: 4,000 rows x 256 -> 40,000 words at a smaller slice of rows). FLOPs: the
three products (logits, input and weight gradients). bf16: float32 leaves under bf16 autocast, as
``convs2s train --precision bf16`` runs it. The cpp backend's float32 products run on ATen's GEMM
or oneDNN's (``cpp-aten``, ``cpp-onednn``; training takes the one measured faster here)."""

import contextlib

import pytest
import torch

import convs2s_kernels as ck

from convs2s_bench.harness import SMOKE, record, run_timed

# the smoke run: one shape of odd sizes over two blocks of rows, the path without the time
SHAPES = [(601, 24, 1001)] if SMOKE else [(2000, 256, 5477), (1000, 256, 40000)]


# (dtype, provider): the cpp float32 products on each GEMM library; bf16's run on ATen's
CASES = [("fp32", "reference"), ("fp32", "cpp-aten"), ("fp32", "cpp-onednn"), ("bf16", "reference"), ("bf16", "cpp")]


@pytest.mark.parametrize("shape", [pytest.param(s, id=f"N{s[0]}_C{s[1]}_V{s[2]}") for s in SHAPES])
@pytest.mark.parametrize("dtype_name,provider", CASES)
def test_output_loss(benchmark, runnable, peaks, device, provider, shape, dtype_name, monkeypatch):
    from convs2s_kernels.ops.output_loss import cpp as output_loss_cpp

    n, c, v = shape
    backend, _, gemm = provider.partition("-")
    if gemm:
        monkeypatch.setenv(output_loss_cpp.GEMM_ENV, gemm)
    x = torch.randn(n, c, device=device, requires_grad=True)
    w = (torch.randn(v, c, device=device) / c ** 0.5).requires_grad_()
    b = torch.zeros(v, device=device, requires_grad=True)
    target = torch.randint(4, v, (n,), device=device)
    bf16 = dtype_name == "bf16"
    runnable(backend, "output_loss", *([t.bfloat16() for t in (x, w, b)] if bf16 else [x, w, b]), target)
    benchmark.group = f"output_loss N{n} C{c} V{v} {dtype_name}"

    def run():
        with torch.autocast(device.type, dtype=torch.bfloat16) if bf16 else contextlib.nullcontext():
            loss, _ = ck.output_loss(x, w, b, target, label_smoothing=0.1, backend=backend)
        loss.backward()
        return loss

    run_timed(benchmark, run, device)
    record(benchmark, flops=3 * 2.0 * n * c * v, bytes_moved=4.0 * (2 * v * c + 2 * n * c), peaks=peaks,
           dtype_name=dtype_name)
