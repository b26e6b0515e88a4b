"""Attention with the embedding sum (softmax(q z^T) (z + e), sqrt(s) scale, padding masked),
forward and forward+backward, per backend.

Training shape: 160 sentences x 25 target x 25 source steps; decoding shape: one query per row
for 32 sentences x beam 5 = 160 rows. E = 512 (most architectures) and 768 (WMT'14 En-Fr).
"""

import pytest
import torch

import convs2s_kernels as ck

from convs2s_bench.harness import DTYPES, record, run_timed, shapes

# (B, T, S, E)
SHAPES = shapes(
    paper=[(160, 25, 25, 512), (160, 25, 25, 768), (160, 1, 25, 768)],
    smoke=[(2, 3, 5, 8), (3, 1, 4, 8)],
)


@pytest.mark.parametrize("mode", ["fwd", "fwd_bwd"])
@pytest.mark.parametrize("dtype_name", list(DTYPES))
@pytest.mark.parametrize("shape", [pytest.param(s, id=f"B{s[0]}_T{s[1]}_S{s[2]}_E{s[3]}") for s in SHAPES])
@pytest.mark.parametrize("backend", ["reference", "cpp", "triton"])
def test_attention_embsum(benchmark, runnable, peaks, device, backend, shape, dtype_name, mode):
    B, T, S, E = shape
    if mode == "fwd_bwd" and T == 1:
        pytest.skip("decoding runs without gradients")
    dtype = DTYPES[dtype_name]
    grad = mode == "fwd_bwd"
    q = torch.randn(B, T, E, device=device, dtype=dtype, requires_grad=grad)
    z = torch.randn(B, S, E, device=device, dtype=dtype, requires_grad=grad)
    y = torch.randn(B, S, E, device=device, dtype=dtype, requires_grad=grad)
    src_lengths = torch.randint(max(1, S // 2), S + 1, (B,), device=device)
    runnable(backend, "attention_embsum", q, z, y, src_lengths)
    benchmark.group = f"attention {mode} B{B} T{T} S{S} E{E} {dtype_name}"
    dctx = torch.randn(B, T, E, device=device, dtype=dtype)

    def run():
        if grad:
            ctx = ck.attention_embsum(q, z, y, src_lengths, backend=backend)
            return torch.autograd.grad(ctx, (q, z, y), dctx)
        with torch.no_grad():
            return ck.attention_embsum(q, z, y, src_lengths, backend=backend)

    run_timed(benchmark, run, device)
    elem = q.element_size()
    flops = 4.0 * B * T * S * E  # two products
    nbytes = elem * (2 * q.numel() + z.numel() + y.numel())
    record(benchmark, flops=flops * (3 if grad else 1), bytes_moved=nbytes * (2.5 if grad else 1),
           peaks=peaks, dtype_name=dtype_name, working_set_bytes=int(nbytes * (2.5 if grad else 1)), device=device)
