"""A decoding step's packed int8 products with 7-bit activations, 8-bit against 7-bit weights
(``linear_w8a8(..., weight_bits=7)``), alternated in one process; medians and ranges per row count.

    python3 bench/tools/int8_weight_bits_ab.py [--rows 1,3,5,8,10,12,15] [--rounds 8]

The 17 weights of a fconv_wmt_en_fr step (10 x 2048 x 3072, 4 x 512 x 1024, 40000 x 512), each
packed once and cycled, so that every product streams its weight from memory as a step does. The
weights hold [-63, 63] for both runs (the same values), so only the kernel path differs: with
``weight_bits=7`` the AVX2 packed kernel adds two products' pairs in int16 before widening them.
Set the AVX2 caps (``CONVS2S_KERNELS_ISA=avx2`` ...) to see that kernel on a VNNI CPU.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import convs2s_kernels as ck
from convs2s_kernels.extension import native

SHAPES = [(2048, 3072)] * 10 + [(512, 1024)] * 4 + [(40000, 512)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="1,3,5,8,10,12,15")
    parser.add_argument("--rounds", type=int, default=8)
    args = parser.parse_args()
    cpp = native()
    gen = torch.Generator().manual_seed(0)
    weights = []
    for N, K in SHAPES:
        q = torch.randint(-63, 64, (N, K), dtype=torch.int8, generator=gen)
        weights.append((q, torch.rand(N, generator=gen) + 0.1, torch.randn(N, generator=gen), ck.pack_w8a8_weight(q), K))
    print(f"int8 kernel: {cpp.linear_w8a8_isa()}, {torch.get_num_threads()} threads")
    for rows in (int(r) for r in args.rows.split(",")):
        xs = {K: torch.randn(rows, K, generator=gen) for *_, K in weights}

        def step(bits: int) -> float:
            t0 = time.perf_counter()
            for q, s, b, packed, K in weights:  # kernel 1: the packed kernel, as the step's measured choice runs it
                cpp.linear_w8a8_with(xs[K], q, s, b, 1, packed, 7, bits)
            return time.perf_counter() - t0

        step(8), step(7)  # warm-up
        times = {8: [], 7: []}
        for i in range(args.rounds):
            for bits in ((8, 7) if i % 2 else (7, 8)):
                times[bits].append(step(bits))
        med = {bits: statistics.median(t) for bits, t in times.items()}
        print(f"{rows:3d} rows: 8-bit weights {1e3 * med[8]:.2f} ms ({1e3 * min(times[8]):.2f}-{1e3 * max(times[8]):.2f}), "
              f"7-bit {1e3 * med[7]:.2f} ms ({1e3 * min(times[7]):.2f}-{1e3 * max(times[7]):.2f}): {med[7] / med[8]:.3f}x",
              flush=True)


if __name__ == "__main__":
    main()
