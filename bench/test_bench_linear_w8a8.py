"""``linear_w8a8`` (int8 weights and int8 activations, each row quantised on the fly) at the
decoder's shapes (``convs2s_bench.products``), in the same groups as ``test_bench_linear_int8.py``
(weight-only int8 and the float32 product it replaces). ``w8a8-packed-cpp``: the weight packed
once (``pack_w8a8_weight``), as a decoder does; ``w7a8-packed-cpp`` with 7-bit activations
(``activation_bits=7``); ``w7a7-packed-cpp`` 7-bit weights too (``quantize_int8(w, bits=7)``,
``weight_bits=7``). The reference runs the exact integer sums, not a fast path."""

import pytest

import convs2s_kernels as ck

from convs2s_bench.products import INT8_SHAPES, SHAPE_IDS, int8_case, operands, time_product

PROVIDERS = ["w8a8-reference", "w8a8-cpp", "w8a8-packed-cpp", "w7a8-packed-cpp", "w7a7-packed-cpp"]
BITS = {"w8a8": {}, "w7a8": dict(activation_bits=7), "w7a7": dict(activation_bits=7, weight_bits=7)}
# held against the int8 GEMM peak of its operands' widths
PEAK_DTYPE = {"w8a8": "int8", "w7a8": "int7", "w7a7": "w7a7"}


@pytest.mark.parametrize("shape", INT8_SHAPES, ids=SHAPE_IDS)
@pytest.mark.parametrize("provider", PROVIDERS)
def test_linear_w8a8(benchmark, runnable, peaks, device, provider, shape):
    form, backend = provider[:4], provider.split("-")[-1]
    bits = BITS[form]
    x, w, b, q, s = operands(shape, device, bits=bits.get("weight_bits", 8))
    runnable(backend, "linear_w8a8", x, q, s, b)
    run, weight_bytes = int8_case(ck.linear_w8a8, backend, x, q, s, b, device, packed="packed" in provider, **bits)
    time_product(benchmark, run, weight_bytes, shape, device, peaks, PEAK_DTYPE[form])
