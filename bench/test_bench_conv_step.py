"""The incremental step (reorder + shift + append + conv + GLU) per backend, at the paper's widths.

Run: ``pytest bench/test_bench_conv_step.py --benchmark-json bench/results/<machine>/<date>.json``.
CI runs it with ``--benchmark-disable`` as a smoke test.
"""

import math

import pytest
import torch

import convs2s_kernels as ck

from bench_utils import record

# (rows N = batch x beam, C_in = C): one sentence greedy, one sentence beam 5, 32 sentences x beam 5.
SHAPES = [pytest.param(n, c, id=f"N{n}_C{c}") for n in (1, 5, 160) for c in (512, 1024)]


DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


@pytest.mark.parametrize("dtype_name", list(DTYPES))
@pytest.mark.parametrize("n,c", SHAPES)
@pytest.mark.parametrize("backend", ["reference", "cpp", "triton"])
def test_conv_step(benchmark, runnable, backend, n, c, dtype_name):
    dtype = DTYPES[dtype_name]  # a string parameter, so the JSON records it
    k = 3
    x_t = torch.randn(n, c, dtype=dtype)
    state = torch.randn(n, k - 1, c, dtype=dtype)
    w = (torch.randn(k, c, 2 * c) / math.sqrt(k * c)).to(dtype)
    b = torch.zeros(2 * c, dtype=dtype)
    parents = torch.arange(n).flip(0)
    runnable(backend, "conv_step", x_t, state, w, b, parents)
    benchmark.group = f"conv_step N{n} C{c} {dtype_name}"

    def step():
        with torch.no_grad():
            return ck.conv_step(x_t, state, w, b, parents, backend=backend)

    step()  # warm-up outside the rounds
    benchmark(step)
    elem = torch.tensor([], dtype=dtype).element_size()
    record(benchmark, flops=2.0 * n * k * c * 2 * c,
           bytes_moved=elem * (w.numel() + b.numel() + 2 * state.numel() + x_t.numel() + n * c))
