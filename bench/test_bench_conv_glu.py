"""Convolution + GLU (+ bias, residual, sqrt(1/2) scale), forward and forward+backward, per backend.

The paper's layer widths: 512/768/1024 channels with kernel width 3 (causal for the decoder,
centred for the encoder) and the 2048-channel kernel-width-1 layers of the En-Fr model, at
4,000 tokens (160 sentences x 25 tokens, the paper's batch size in tokens).

Run: ``pytest bench/test_bench_conv_glu.py --benchmark-json bench/results/<machine>/<name>.json``.
"""

import math

import pytest
import torch

import convs2s_kernels as ck

from convs2s_bench.harness import DTYPES, record, run_timed, shapes

# (B, T, C, k, causal)
SHAPES = shapes(
    paper=[(160, 25, 512, 3, True), (160, 25, 512, 3, False), (160, 25, 768, 3, True),
           (160, 25, 1024, 3, True), (160, 25, 2048, 1, True)],
    smoke=[(2, 5, 16, 3, True), (2, 5, 16, 1, False)],
)
SQRT_HALF = math.sqrt(0.5)


@pytest.mark.parametrize("mode", ["fwd", "fwd_bwd"])
@pytest.mark.parametrize("dtype_name", list(DTYPES))
@pytest.mark.parametrize("shape", [pytest.param(s, id=f"B{s[0]}_T{s[1]}_C{s[2]}_k{s[3]}_{'causal' if s[4] else 'centred'}")
                                   for s in SHAPES])
@pytest.mark.parametrize("backend", ["reference", "cpp", "triton"])
def test_conv_glu(benchmark, runnable, peaks, device, backend, shape, dtype_name, mode):
    B, T, C, k, causal = shape
    dtype = DTYPES[dtype_name]
    grad = mode == "fwd_bwd"
    x = torch.randn(B, T, C, device=device, dtype=dtype, requires_grad=grad)
    w = (torch.randn(k, C, 2 * C, device=device) / math.sqrt(k * C)).to(dtype).requires_grad_(grad)
    b = (0.1 * torch.randn(2 * C, device=device)).to(dtype).requires_grad_(grad)
    res = torch.randn(B, T, C, device=device, dtype=dtype, requires_grad=grad)
    kwargs = dict(causal=causal, residual=res, scale=SQRT_HALF)
    runnable(backend, "conv_glu", x, w, b, **kwargs)
    benchmark.group = f"conv_glu {mode} B{B} T{T} C{C} k{k} {'causal' if causal else 'centred'} {dtype_name}"
    dout = torch.randn(B, T, C, device=device, dtype=dtype)

    def run():
        if grad:
            out = ck.conv_glu(x, w, b, backend=backend, **kwargs)
            return torch.autograd.grad(out, (x, w, b, res), dout)
        with torch.no_grad():
            return ck.conv_glu(x, w, b, backend=backend, **kwargs)

    run_timed(benchmark, run, device)
    elem = x.element_size()
    gemm = 2.0 * B * T * k * C * 2 * C
    # forward: read x, w, residual, write out; backward (two more GEMMs): read dout, x, w, write dx, dw, dres
    fwd_bytes = elem * (x.numel() + w.numel() + 2 * res.numel())
    bwd_bytes = elem * (3 * x.numel() + 2 * w.numel() + 2 * res.numel())
    moved = fwd_bytes + (bwd_bytes if grad else 0)  # the same tensors every round: resident where they fit
    record(benchmark, flops=gemm * (3 if grad else 1), bytes_moved=moved, peaks=peaks, dtype_name=dtype_name,
           working_set_bytes=moved, device=device)
