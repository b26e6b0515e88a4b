"""The decoding step's matrix products, shared by the ``linear``, ``linear_int8`` and ``linear_w8a8``
suites: the WMT'14 En-Fr decoder's shapes (a 512->1024 residual projection, the 768->512 attention
projection, fc2's 4096->512 and fc3's 512->40000) at a step's few rows, and past the few-row
kernels; and one int8 case, timed against the float32 product it replaces."""

import torch

from .harness import packed_copies, record, rotating, run_timed, shapes

FEW_ROW_SHAPES = shapes(paper=[(m, k, n) for m in (1, 5, 8, 12, 16)
                               for k, n in ((512, 1024), (768, 512), (4096, 512), (512, 40000))],
                        smoke=[(1, 16, 24), (5, 16, 24)])
MANY_ROW_SHAPES = shapes(paper=[(m, k, n) for m in (64, 160) for k, n in ((1536, 1024), (512, 40000))],
                         smoke=[(70, 16, 24)])
# int8 also at the rows of many sentences x beam 5, where weight-only int8 lost to fp32
INT8_SHAPES = FEW_ROW_SHAPES + shapes(paper=[(m, k, n) for m in (32, 64, 160) for k, n in ((1536, 1024), (512, 40000))],
                                      smoke=[(70, 16, 24)])
SHAPE_IDS = [f"M{m}_K{k}_N{n}" for m, k, n in INT8_SHAPES]


def fp32_case(x, w, b, device):
    """The float32 product an int8 one replaces: ``linear`` on the kernel choice measured for it."""
    import convs2s_kernels as ck
    from convs2s_kernels.tune import Shape, ensure

    if device.type == "cpu" and ck.available_backends()["cpp"] is None:
        ensure([Shape("nk", "float32", w.shape[1], w.shape[0])])
    weight = rotating(w, device)

    def run():
        with torch.no_grad():
            return ck.linear(x, weight(), b)
    return run, 4 * w.numel()


def int8_case(op, backend, x, q, s, b, device, packed=False, **bits):
    """``op(x, q, s, b)`` on ``backend`` with the weight streamed from memory every round (and its
    ``pack_w8a8_weight`` copy, as a decoder packs it once, when ``packed``)."""
    import convs2s_kernels as ck

    qweight = rotating(q, device)
    packs = packed_copies(qweight, ck.pack_w8a8_weight, "int8", enabled=packed)

    def run():
        weight = qweight()
        extra = dict(bits, packed=packs[weight.data_ptr()]) if packs else bits
        with torch.no_grad():
            return op(x, weight, s, b, backend=backend, **extra)
    if backend == "cpp":  # the op checks each new weight tensor once (its int8 range): not in the rounds
        for _ in range(qweight.count):
            run()
    return run, q.numel() + 4 * q.shape[0]


def time_product(benchmark, run, weight_bytes, shape, device, peaks, dtype_name):
    """Times one case in the shape's group (every int8 provider and the fp32 one side by side)."""
    m, k, n = shape
    benchmark.group = f"linear_int8 M{m} K{k} N{n}"
    run_timed(benchmark, run, device)
    record(benchmark, flops=2.0 * m * k * n, bytes_moved=weight_bytes + 4 * (n + m * (k + n)),
           peaks=peaks, dtype_name=dtype_name)


def operands(shape, device, bits=8):
    import convs2s_kernels as ck

    m, k, n = shape
    x = torch.randn(m, k, device=device)
    w = torch.randn(n, k, device=device) / k ** 0.5
    b = torch.randn(n, device=device)
    q, s = ck.quantize_int8(w, bits=bits)
    return x, w, b, q, s
