"""``linear_int8`` (weight-only int8: a quarter of float32's bytes streamed, float32 activations)
against the float32 product it replaces (``fp32-weights``: ``linear`` on the kernel choice measured
for the shape), at the decoder's shapes (``convs2s_bench.products``). The reference dequantises,
not a fast path. ``linear_w8a8`` (int8 activations too) shares these groups:
``test_bench_linear_w8a8.py``."""

import pytest

import convs2s_kernels as ck

from convs2s_bench.products import INT8_SHAPES, SHAPE_IDS, fp32_case, int8_case, operands, time_product


@pytest.mark.parametrize("shape", INT8_SHAPES, ids=SHAPE_IDS)
@pytest.mark.parametrize("provider", ["fp32-weights", "reference", "cpp"])
def test_linear_int8(benchmark, runnable, peaks, device, provider, shape):
    x, w, b, q, s = operands(shape, device)
    if provider == "fp32-weights":
        run, weight_bytes = fp32_case(x, w, b, device)
    else:
        runnable(provider, "linear_int8", x, q, s, b)
        run, weight_bytes = int8_case(ck.linear_int8, provider, x, q, s, b, device)
    time_product(benchmark, run, weight_bytes, shape, device, peaks, "fp32")
