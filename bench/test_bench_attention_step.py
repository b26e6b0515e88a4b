"""``attention_step``: one decoding step of a folded attention layer with its residual, per backend,
at the paper's step shapes: 128 sentences x beam 5 (Table 3's batch) and one sentence x beam 5,
source length 25, C = 512 and 1024 (the WMT'14 decoders' widths). The reference is the tensor
operations the decoding step ran before the op (one kernel each on a GPU); Triton is one kernel."""

import pytest
import torch

import convs2s_kernels as ck

from convs2s_bench.harness import DTYPES, record, run_timed, shapes

# (B, beam, S, C)
SHAPES = shapes(paper=[(128, 5, 25, 512), (128, 5, 25, 1024), (1, 5, 25, 512)], smoke=[(2, 3, 5, 8), (1, 1, 4, 16)])


@pytest.mark.parametrize("dtype_name", list(DTYPES))
@pytest.mark.parametrize("shape", [pytest.param(s, id=f"B{s[0]}_beam{s[1]}_S{s[2]}_C{s[3]}") for s in SHAPES])
@pytest.mark.parametrize("backend", ["reference", "triton"])
def test_attention_step(benchmark, runnable, peaks, device, backend, shape, dtype_name):
    B, beam, S, C = shape
    dtype = DTYPES[dtype_name]
    r = lambda *size, scale=1.0: (torch.randn(*size, device=device) * scale).to(dtype)
    args = (r(B, beam, C), r(B, beam, S), r(B, S), r(B, S, C, scale=C ** -0.5), r(B, S, C), r(C, scale=0.1),
            torch.randint(max(1, S // 2), S + 1, (B,), device=device), r(B, beam, C))
    runnable(backend, "attention_step", *args)
    benchmark.group = f"attention_step B{B} beam{beam} S{S} C{C} {dtype_name}"

    def run():
        with torch.no_grad():
            return ck.attention_step(*args, backend=backend)

    run_timed(benchmark, run, device)
    elem = args[0].element_size()
    nbytes = elem * (2 * B * S * C + B * S + B * beam * S + 3 * B * beam * C + C)  # z_in, y_out read once
    record(benchmark, flops=4.0 * B * beam * S * C, bytes_moved=nbytes, peaks=peaks, dtype_name=dtype_name,
           working_set_bytes=nbytes, device=device)
