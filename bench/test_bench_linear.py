"""The decoding step's projections (``linear``): a few rows (sentences x beam) against a large
weight, per backend. Shapes of the WMT'14 En-Fr decoder: a 512->1024 residual projection, the
768->512 input projection and the 256->40000 vocabulary projection, at 1, 5 and 8 rows."""

import pytest
import torch

import convs2s_kernels as ck

from bench_utils import DTYPES, record, run_timed, shapes

SHAPES = shapes(paper=[(m, k, n) for m in (1, 5, 8) for k, n in ((512, 1024), (768, 512), (256, 40000))],
                smoke=[(5, 16, 24)])


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
    benchmark.group = f"linear M{m} K{k} N{n} {dtype_name}"

    def run():
        with torch.no_grad():
            return ck.linear(x, w, b, backend=backend)

    run_timed(benchmark, run, device)
    record(benchmark, flops=2.0 * m * k * n, bytes_moved=x.element_size() * (w.numel() + n + m * (k + n)),
           peaks=peaks, dtype_name=dtype_name)
