"""The decoding step's projections (``linear``; ``linear_int8`` and ``linear_w8a8`` with int8 weights): a few rows
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

from convs2s_bench.harness import DTYPES, packed_copies, record, rotating, run_timed, shapes

TUNED_DTYPES = {torch.float32: "float32", torch.bfloat16: "bfloat16"}
FEW_ROW_SHAPES = shapes(paper=[(m, k, n) for m in (1, 5, 8, 12, 16)
                               for k, n in ((512, 1024), (768, 512), (4096, 512), (512, 40000))],
                        smoke=[(1, 16, 24), (5, 16, 24)])
SHAPES = FEW_ROW_SHAPES + shapes(paper=[(m, k, n) for m in (64, 160) for k, n in ((1536, 1024), (512, 40000))],
                                 smoke=[(70, 16, 24)])


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


# int8 also at the rows of many sentences x beam 5, where weight-only int8 lost to fp32
INT8_SHAPES = FEW_ROW_SHAPES + shapes(paper=[(m, k, n) for m in (32, 64, 160) for k, n in ((1536, 1024), (512, 40000))],
                              smoke=[(70, 16, 24)])
INT8_PROVIDERS = {"reference": ck.linear_int8, "cpp": ck.linear_int8,
                  "w8a8-reference": ck.linear_w8a8, "w8a8-cpp": ck.linear_w8a8, "w8a8-packed-cpp": ck.linear_w8a8,
                  "w7a8-packed-cpp": ck.linear_w8a8, "w7a7-packed-cpp": ck.linear_w8a8}


@pytest.mark.parametrize("shape", [pytest.param(s, id=f"M{s[0]}_K{s[1]}_N{s[2]}") for s in INT8_SHAPES])
@pytest.mark.parametrize("provider", ["fp32-weights", *INT8_PROVIDERS])
def test_linear_int8(benchmark, runnable, peaks, device, provider, shape):
    """int8 weights against the float32 product they replace (``fp32-weights``: the fastest float32
    path, ``linear`` with the kernel choice measured for the shape); ``reference``/``cpp`` are
    weight-only int8 (``linear_int8``), ``w8a8-*`` int8 weights and activations (``linear_w8a8``;
    ``w8a8-packed-cpp`` with the weight packed once, ``pack_w8a8_weight``, as a decoder does;
    ``w7a8-packed-cpp`` the same with 7-bit activations, ``activation_bits=7``; ``w7a7-packed-cpp``
    with 7-bit weights too, ``quantize_int8(w, bits=7)`` and ``weight_bits=7``).
    The int8 references run the definition (dequantise, or exact integer sums), not a fast path."""
    m, k, n = shape
    x = torch.randn(m, k, device=device)
    w = torch.randn(n, k, device=device) / k ** 0.5
    b = torch.randn(n, device=device)
    seven = {"w7a8": dict(activation_bits=7), "w7a7": dict(activation_bits=7, weight_bits=7)}.get(provider[:4], {})
    q, s = ck.quantize_int8(w, bits=seven.get("weight_bits", 8))
    if provider == "fp32-weights":
        if device.type == "cpu" and ck.available_backends()["cpp"] is None:
            ensure([Shape("nk", "float32", k, n)])
        weight = rotating(w, device)

        def run():
            with torch.no_grad():
                return ck.linear(x, weight(), b)
        weight_bytes = 4 * w.numel()
    else:
        op, backend = INT8_PROVIDERS[provider], provider.split("-")[-1]
        runnable(backend, op.__name__, x, q, s, b)
        qweight = rotating(q, device)
        packs = packed_copies(qweight, ck.pack_w8a8_weight, "int8", enabled="packed" in provider)

        def run():
            weight = qweight()
            extra = dict(seven, packed=packs[weight.data_ptr()]) if packs else seven
            with torch.no_grad():
                return op(x, weight, s, b, backend=backend, **extra)
        if backend == "cpp":  # the op checks each new weight tensor once (its int8 range): not in the rounds
            for _ in range(qweight.count):
                run()
        weight_bytes = q.numel() + 4 * n
    benchmark.group = f"linear_int8 M{m} K{k} N{n}"
    run_timed(benchmark, run, device)
    # w8a8 multiplies int8 by int8: held against the int8 GEMM peak (w7a8: with 7-bit activations,
    # w7a7: 7-bit weights too); the others compute in fp32
    dtype_name = {"w8a8": "int8", "w7a8": "int7", "w7a7": "w7a7"}.get(provider.split("-")[0], "fp32")
    record(benchmark, flops=2.0 * m * k * n, bytes_moved=weight_bytes + 4 * (n + m * (k + n)),
           peaks=peaks, dtype_name=dtype_name)
