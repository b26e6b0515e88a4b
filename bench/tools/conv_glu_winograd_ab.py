"""The cpp convolution + GLU in training, im2col and one GEMM against Winograd F(2, 3) and F(4, 3),
forward and forward + backward, alternated in one process; medians, ranges and every round's time.

    python3 bench/tools/conv_glu_winograd_ab.py [--shapes iwslt|paper|small|all] [--rounds 5 --reps 5] [--json OUT]

``iwslt``: fconv_iwslt_de_en's layers at the Multi30k recipe's batch (120 sentences x 16 tokens,
256 channels, the decoder's causal and the encoder's centred convolutions, left padding on a third
of the encoder's rows); ``paper``: the paper's 4,000-token batch at 512 (causal) and 768 (centred)
channels; ``small``: 64, 128 and 256 rows of 256 channels, about where the cpp backend starts using
Winograd tiles (``WINOGRAD_MIN_ROWS``). Each call as training makes it: bias, residual, sqrt(1/2) scale, gradients for all four.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import time

import torch

import convs2s_kernels as ck
from convs2s_kernels.env import machine_description

SHAPES = {"iwslt": [(120, 16, 256, True), (120, 16, 256, False)],
          "paper": [(160, 25, 512, True), (160, 25, 768, False)],
          "small": [(4, 16, 256, True), (8, 16, 256, True), (16, 16, 256, True)]}  # around WINOGRAD_MIN_ROWS
TILES = (0, 2, 4)


def case(B: int, T: int, C: int, causal: bool):
    x = torch.randn(B, T, C, requires_grad=True)
    w = (torch.randn(3, C, 2 * C) / math.sqrt(3 * C)).requires_grad_()
    b = (0.1 * torch.randn(2 * C)).requires_grad_()
    res = torch.randn(B, T, C, requires_grad=True)
    mask = None
    if not causal:  # the encoder's left padding
        mask = torch.zeros(B, T, dtype=torch.bool)
        mask[::3, :2] = True
    dout = torch.randn(B, T, C)

    def run(backward: bool):
        out = ck.conv_glu(x, w, b, causal=causal, residual=res, scale=math.sqrt(0.5), pad_mask=mask, backend="cpp")
        return torch.autograd.grad(out, (x, w, b, res), dout) if backward else out
    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", choices=["iwslt", "paper", "small", "all"], default="iwslt")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--reps", type=int, default=5, help="calls timed together in a round")
    parser.add_argument("--json")
    args = parser.parse_args()
    shapes = sum(SHAPES.values(), []) if args.shapes == "all" else SHAPES[args.shapes]
    torch.manual_seed(0)
    from convs2s_kernels.ops.conv_glu import cpp as conv_cpp

    conv_cpp.WINOGRAD_MIN_ROWS = 0  # every tile at every size here, whatever the default threshold
    results = dict(machine=machine_description("cpu"), threads=torch.get_num_threads(), torch=torch.__version__,
                   rounds=args.rounds, reps=args.reps, cases=[])
    print(f"{results['machine']['cpu']}, {results['threads']} threads; milliseconds a call, median (range) of "
          f"{args.rounds} alternated rounds of {args.reps} calls")
    for B, T, C, causal in shapes:
        run = case(B, T, C, causal)
        for mode in ("fwd", "fwd_bwd"):
            times = {t: [] for t in TILES}
            for rnd in range(args.rounds):
                for tile in TILES if rnd % 2 == 0 else TILES[::-1]:
                    os.environ["CONVS2S_CONV_WINOGRAD"] = str(tile)
                    run(mode == "fwd_bwd")  # untimed: the first call after a switch
                    t0 = time.perf_counter()
                    for _ in range(args.reps):
                        run(mode == "fwd_bwd")
                    times[tile].append((time.perf_counter() - t0) / args.reps * 1e3)
            med = {t: statistics.median(v) for t, v in times.items()}
            name = f"B{B} T{T} C{C} {'causal' if causal else 'centred'} {mode}"
            print(f"{name}: " + ", ".join(f"{'im2col' if t == 0 else f'F({t},3)'} {med[t]:.2f} "
                                          f"({min(v):.2f}-{max(v):.2f})" for t, v in times.items()) +
                  f"; im2col / F(2,3) {med[0] / med[2]:.2f}x, im2col / F(4,3) {med[0] / med[4]:.2f}x", flush=True)
            results["cases"].append(dict(B=B, T=T, C=C, causal=causal, mode=mode,
                                         ms={("im2col" if t == 0 else f"F({t},3)"): v for t, v in times.items()}))
    os.environ.pop("CONVS2S_CONV_WINOGRAD", None)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
