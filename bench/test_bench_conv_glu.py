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

from convs2s_bench.harness import DTYPES, packed_copies, record, rotating, run_timed, shapes
from convs2s_kernels.tune import Shape, ensure

# (B, T, C, k, causal)
SHAPES = shapes(
    paper=[(160, 25, 512, 3, True), (160, 25, 512, 3, False), (160, 25, 768, 3, True),
           (160, 25, 1024, 3, True), (160, 25, 2048, 1, True)],
    smoke=[(2, 5, 16, 3, True), (2, 5, 16, 1, False)],
)
SQRT_HALF = math.sqrt(0.5)
# (B, T, C): an encoder translating a batch of one to three equal-length sentences, centred k = 3
ENCODER_SHAPES = shapes(paper=[(1, 27, 512), (2, 30, 768), (3, 25, 1024)], smoke=[(1, 5, 16)])
TUNED_DTYPES = {torch.float32: "float32", torch.bfloat16: "bfloat16"}


@pytest.mark.parametrize("mode", ["fwd", "fwd_bwd"])
@pytest.mark.parametrize("dtype_name", list(DTYPES))
@pytest.mark.parametrize("shape", [pytest.param(s, id=f"B{s[0]}_T{s[1]}_C{s[2]}_k{s[3]}_{'causal' if s[4] else 'centred'}")
                                   for s in SHAPES])
@pytest.mark.parametrize("backend", ["reference", "cpp", "cpp-im2col", "triton"])
def test_conv_glu(benchmark, runnable, peaks, device, backend, shape, dtype_name, mode, monkeypatch):
    """``cpp``: in training (fwd_bwd) its width-3 convolutions run Winograd tiles (fewer products:
    the row counts those it ran); ``cpp-im2col``: the same kernel made to keep im2col and one GEMM."""
    from convs2s_kernels.ops.conv_glu.cpp import winograd_tile

    B, T, C, k, causal = shape
    if backend == "cpp-im2col":
        if mode == "fwd":
            pytest.skip("without gradients the cpp convolution is im2col already: the cpp row")
        backend = "cpp"
        monkeypatch.setenv("CONVS2S_CONV_WINOGRAD", "0")
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
    tile = winograd_tile(x, w) if backend == "cpp" and grad else 0
    if tile:  # B * ceil(T / m) tiles of m + 2 points, each a product over C_in
        gemm = 2.0 * B * -(-T // tile) * (tile + 2) * C * 2 * C
    # forward: read x, w, residual, write out; backward (two more GEMMs): read dout, x, w, write dx, dw, dres
    fwd_bytes = elem * (x.numel() + w.numel() + 2 * res.numel())
    bwd_bytes = elem * (3 * x.numel() + 2 * w.numel() + 2 * res.numel())
    moved = fwd_bytes + (bwd_bytes if grad else 0)  # the same tensors every round: resident where they fit
    record(benchmark, flops=gemm * (3 if grad else 1), bytes_moved=moved, peaks=peaks, dtype_name=dtype_name,
           working_set_bytes=moved, device=device)


@pytest.mark.parametrize("dtype_name", list(DTYPES))
@pytest.mark.parametrize("shape", [pytest.param(s, id=f"B{s[0]}_T{s[1]}_C{s[2]}") for s in ENCODER_SHAPES])
@pytest.mark.parametrize("backend", ["reference", "cpp", "cpp-packed"])
def test_conv_glu_translating(benchmark, runnable, peaks, device, backend, shape, dtype_name):
    """The encoder's layer when translating: a few dozen rows against a weight met in memory.
    ``cpp-packed``: reading ``pack_conv_step_weight(weight)``, as the encoder does; the cpp
    variants with the kernel choice measured for their form first, as the encoder has it."""
    B, T, C = shape
    k, dtype = 3, DTYPES[dtype_name]
    packing = backend == "cpp-packed"
    backend = "cpp" if packing else backend
    x = torch.randn(B, T, C, device=device, dtype=dtype)
    w = (torch.randn(k, C, 2 * C, device=device) / math.sqrt(k * C)).to(dtype)
    b = (0.1 * torch.randn(2 * C, device=device)).to(dtype)
    res = torch.randn(B, T, C, device=device, dtype=dtype)
    kwargs = dict(causal=False, residual=res, scale=SQRT_HALF)
    runnable(backend, "conv_glu", x, w, b, **kwargs)
    if backend == "cpp" and dtype in TUNED_DTYPES:
        ensure([Shape("kp" if packing else "kn", TUNED_DTYPES[dtype], k * C, 2 * C)])
    benchmark.group = f"conv_glu translating B{B} T{T} C{C} {dtype_name}"
    weight = rotating(w, device)
    packs = packed_copies(weight, ck.pack_conv_step_weight, dtype_name, enabled=packing)

    def run():
        wt = weight()
        with torch.no_grad():
            return ck.conv_glu(x, wt, b, packed=packs.get(wt.data_ptr()), backend=backend, **kwargs)

    run_timed(benchmark, run, device)
    elem = x.element_size()
    record(benchmark, flops=2.0 * B * T * k * C * 2 * C, bytes_moved=elem * (x.numel() + w.numel() + 2 * res.numel()),
           peaks=peaks, dtype_name=dtype_name)
