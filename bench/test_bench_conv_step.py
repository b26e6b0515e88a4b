"""The incremental step (reorder + shift + append + conv + GLU) per backend, at the paper's widths.

Run: ``pytest bench/test_bench_conv_step.py --benchmark-json bench/results/<machine>/<date>.json``.
CI runs it with ``--benchmark-disable`` as a smoke test.
"""

import math

import pytest
import torch

import convs2s_kernels as ck

from convs2s_bench.harness import DTYPES, packed_copies, record, rotating, run_timed, shapes

# (rows N = batch x beam, C_in = C): one sentence greedy, one sentence beam 5, 32 sentences x beam 5.
SHAPES = [pytest.param(n, c, id=f"N{n}_C{c}")
          for n, c in shapes(paper=[(n, c) for n in (1, 5, 160) for c in (512, 1024)], smoke=[(1, 16), (5, 16)])]


@pytest.mark.parametrize("dtype_name", list(DTYPES))
@pytest.mark.parametrize("n,c", SHAPES)
@pytest.mark.parametrize("backend", ["reference", "cpp", "cpp-packed", "triton"])
def test_conv_step(benchmark, runnable, peaks, device, backend, n, c, dtype_name):
    """``cpp-packed``: the cpp backend reading ``pack_conv_step_weight(weight)``, as the decoder does."""
    dtype = DTYPES[dtype_name]  # a string parameter, so the JSON records it
    k = 3
    x_t = torch.randn(n, c, dtype=dtype, device=device)
    state = torch.randn(n, k - 1, c, dtype=dtype, device=device)
    w = (torch.randn(k, c, 2 * c, device=device) / math.sqrt(k * c)).to(dtype)
    b = (0.1 * torch.randn(2 * c, device=device)).to(dtype)
    parents = torch.arange(n, device=device).flip(0)
    packing = backend == "cpp-packed"
    backend = "cpp" if packing else backend
    runnable(backend, "conv_step", x_t, state, w, b, parents)
    benchmark.group = f"conv_step N{n} C{c} {dtype_name}"
    weight = rotating(w, device)  # a decoding step meets its weight in memory, not in cache
    packs = packed_copies(weight, ck.pack_conv_step_weight, dtype_name, enabled=packing)

    def step():
        wt = weight()
        with torch.no_grad():
            return ck.conv_step(x_t, state, wt, b, parents, packed=packs.get(wt.data_ptr()), backend=backend)

    run_timed(benchmark, step, device)
    elem = torch.tensor([], dtype=dtype).element_size()
    record(benchmark, flops=2.0 * n * k * c * 2 * c,
           bytes_moved=elem * (w.numel() + b.numel() + 2 * state.numel() + x_t.numel() + n * c),
           peaks=peaks, dtype_name=dtype_name)
