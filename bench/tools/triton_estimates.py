"""What the Triton kernels should take on a GPU, from their arithmetic: FLOPs and bytes per call.

For each kernel at the paper's En-Fr shapes (``fconv_wmt_en_fr``: 4,000-token batches of
160 x 25, conv widths 512-4096, embeddings 768; decoding steps of N = 5 and 160 rows) this prints
the FLOPs the kernel executes, the bytes it must move to and from memory (each tensor once:
the compulsory traffic, re-reads assumed to hit L2), and the lower bound on its time that a
GPU's matrix rate and memory bandwidth imply: ``max(FLOPs / rate, bytes / bandwidth)``. Hold the
first real GPU run (``pytest bench/ -k triton --benchmark-json ...``) against it.

Run: ``python3 bench/tools/triton_estimates.py [--gpu h100-sxm|h100-pcie|a100]``.
"""

from __future__ import annotations

import argparse
from typing import Dict, List, Tuple

# Dense rates (no sparsity) in FLOP/s and memory bandwidth in bytes/s, from NVIDIA's datasheets.
# fp32 runs in full IEEE precision (the kernels' default, as PyTorch's matmul default), i.e. on the
# FMA units, not TF32 tensor cores.
GPUS: Dict[str, Dict[str, float]] = {
    "h100-sxm": dict(bf16=989e12, fp16=989e12, fp32=67e12, bandwidth=3.35e12),
    "h100-pcie": dict(bf16=756e12, fp16=756e12, fp32=51e12, bandwidth=2.0e12),
    "a100": dict(bf16=312e12, fp16=312e12, fp32=19.5e12, bandwidth=2.0e12),
}
ELEM = {"bf16": 2, "fp16": 2, "fp32": 4}
BLOCK_E = 128  # the attention forward's output tile over the embedding (scores recomputed E / BLOCK_E times)

Row = Tuple[str, float, float]  # (case, flops, bytes)


def conv_glu_rows(e: int) -> List[Row]:
    rows = []
    M = 160 * 25
    for C, k in [(512, 3), (768, 3), (1024, 3), (2048, 1), (4096, 1)]:
        gemm = 2.0 * M * k * C * 2 * C
        w = k * C * 2 * C
        fwd_bytes = e * (M * C + w + 2 * C + M * C + M * C)  # x, W, bias, residual, out
        rows.append((f"conv_glu fwd   M {M} C {C} k {k}", gemm, fwd_bytes))
        rows.append((f"conv_glu fwd (training: saves pre) M {M} C {C} k {k}", gemm, fwd_bytes + e * M * 2 * C))
        bwd_bytes = e * (
            (M * 2 * C + M * C + M * 2 * C)  # GLU backward: read pre, dout; write dpre
            + (M * 2 * C + w + M * C)  # dx: read dpre, W; write dx
            + (M * C + M * 2 * C)  # dW: read x, dpre
            + 2 * M * C  # dresidual = dout * scale
            + w  # dW in the input dtype, at once (its tiles fill the GPU at these widths: no partials)
        )
        rows.append((f"conv_glu bwd   M {M} C {C} k {k}", 2 * gemm, bwd_bytes))  # dx and dW
    return rows


def attention_rows(e: int) -> List[Row]:
    B, T, S, E = 160, 25, 25, 768
    rows = []
    for name, t in (("train", T), ("decode", 1)):
        qk = 2.0 * B * t * S * E
        recompute = -(-E // BLOCK_E)
        fwd_bytes = e * (B * t * E + 2 * B * S * E + B * t * E) + 4 * B * t  # q, z, y, out, lse
        rows.append((f"attention fwd  {name} B {B} T {t} S {S} E {E}", qk * recompute + qk, fwd_bytes))
    # backward (training shape, T and S <= 64: one fused kernel): scores and dP recomputed, then
    # dq, dz, dy; P and dS stay in registers
    qk = 2.0 * B * T * S * E
    bwd_bytes = e * (2 * B * T * E + 2 * B * S * E + B * T * E  # reads: q, dctx; z, y; the context (for D)
                     + B * T * E + 2 * B * S * E) + 4 * B * T  # writes dq, dz, dy; reads the lse
    rows.append((f"attention bwd  train B {B} T {T} S {S} E {E}", 2 * qk + 3 * qk, bwd_bytes))
    return rows


def conv_step_rows(e: int) -> List[Row]:
    rows = []
    k = 3
    for N in (1, 5, 160):
        for C in (512, 1024):
            w = k * C * 2 * C
            bytes_ = e * (w + 2 * C + N * C + N * (k - 1) * C + N * (k - 1) * C + N * C)  # W, bias, x, state, new, out
            rows.append((f"conv_step      N {N} C {C} k {k}", 2.0 * N * k * C * 2 * C, bytes_))
    return rows


def table(gpu: str) -> str:
    spec = GPUS[gpu]
    lines = [f"GPU {gpu}: bf16/fp16 {spec['bf16'] / 1e12:.0f} TFLOP/s, fp32 {spec['fp32'] / 1e12:.1f} TFLOP/s, "
             f"{spec['bandwidth'] / 1e12:.2f} TB/s", "",
             "| kernel | dtype | GFLOP | MB moved | FLOP/byte | bound | lower bound (us) |",
             "|---|---|---:|---:|---:|---|---:|"]
    for dtype in ("bf16", "fp32"):
        e = ELEM[dtype]
        for name, flops, bytes_ in conv_glu_rows(e) + attention_rows(e) + conv_step_rows(e):
            t_math = flops / spec[dtype]
            t_mem = bytes_ / spec["bandwidth"]
            bound = "math" if t_math >= t_mem else "memory"
            lines.append(f"| {name} | {dtype} | {flops / 1e9:.3f} | {bytes_ / 1e6:.2f} | {flops / bytes_:.0f} | "
                         f"{bound} | {max(t_math, t_mem) * 1e6:.1f} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpu", choices=sorted(GPUS), default="h100-sxm")
    args = parser.parse_args(argv)
    print(table(args.gpu))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
