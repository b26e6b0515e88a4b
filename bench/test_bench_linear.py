"""The decoding step's projections (``linear``; the int8 products are in ``test_bench_linear_int8.py``
and ``test_bench_linear_w8a8.py``): a few rows
(sentences x beam) against a large weight, per backend. Shapes of the WMT'14 En-Fr decoder: a
512->1024 residual projection, the 768->512 attention projection, the 4096->512 output
projection (fc2) and the 512->40000 vocabulary projection (fc3), at 1, 5, 8, 12 and 16 rows; and
past the few-row kernels (64 and 160 rows of a 1536->1024 conv-sized product and of fc3), where the
cpp backend runs the GEMM library measured faster for the shape (ATen's or oneDNN's,
``csrc/library_gemm.cpp``) and the reference ATen's. The cpp rows run the kernel choice measured for
each shape (``convs2s_kernels.tune``, outside the timing)."""

import pytest
import torch

import convs2s_kernels as ck
from convs2s_kernels.tune import Shape, ensure

from convs2s_bench.harness import DTYPES, record, rotating, run_timed
from convs2s_bench.products import FEW_ROW_SHAPES, MANY_ROW_SHAPES

TUNED_DTYPES = {torch.float32: "float32", torch.bfloat16: "bfloat16"}
SHAPES = FEW_ROW_SHAPES + MANY_ROW_SHAPES


@pytest.mark.parametrize("dtype_name", list(DTYPES))
@pytest.mark.parametrize("shape", [pytest.param(s, id=f"M{s[0]}_K{s[1]}_N{s[2]}") for s in SHAPES])
@pytest.mark.parametrize("backend", ["reference", "cpp"])  # on GPUs a linear is a cuBLAS GEMM
def test_linear(benchmark, runnable, peaks, device, backend, shape, dtype_name):
    m, k, n = shape
    dtype = DTYPES[dtype_name]
    x = torch.randn(m, k, device=device, dtype=dtype)
    w = (torch.randn(n, k, device=device) / k ** 0.5).to(dtype)
    b = torch.randn(n, device=device, dtype=dtype)
    runnable(backend, "linear", x, w, b)
    if backend == "cpp" and dtype in TUNED_DTYPES:  # as a decoder does before its first step
        ensure([Shape("nk", TUNED_DTYPES[dtype], k, n)])
    benchmark.group = f"linear M{m} K{k} N{n} {dtype_name}"
    weight = rotating(w, device)  # streamed from memory every round, as in a decoding step

    def run():
        with torch.no_grad():
            return ck.linear(x, weight(), b, backend=backend)

    run_timed(benchmark, run, device)
    record(benchmark, flops=2.0 * m * k * n, bytes_moved=x.element_size() * (w.numel() + n + m * (k + n)),
           peaks=peaks, dtype_name=dtype_name)
