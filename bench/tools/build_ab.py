"""Two builds of the C++ extension, side by side: the CPU products (w8a8 reducing and packed, 7-bit
activations, weight-only int8, float32 few-row (N, K), (K, N) and packed) and the one-call decoder
step (fconv_wmt_en_de's 15 decoder layers, packed weights, one sentence at beam 1 and 5) of each
``_C`` shared object timed in its own process, processes alternated (ABBA) over rounds; the median of 41 calls
on weights cycled cold per case, then per case the median over rounds with its range and the
paired ratios. For a refactoring of ``csrc/`` that must leave speed unchanged.

    cp convs2s_kernels/_C*.so /tmp/old.so   # before; rebuild; then
    python3 bench/tools/build_ab.py /tmp/old.so convs2s_kernels/_C*.so --rounds 6 --json out.json
"""
import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import time

import torch


K, N = 2048, 3072  # a decoder conv weight of fconv_wmt_en_fr's (3 x 1024 -> 2 x 1536)
CALLS = 41


def w8a8_packed(q: torch.Tensor) -> torch.Tensor:
    """pack_w8a8_weight's layout, written out: importing convs2s_kernels would load its own _C."""
    n, k = q.shape
    blocks, k4 = (n + 63) // 64, (k + 63) // 64 * 16
    padded = q.new_zeros(blocks * 64, k4 * 4)
    padded[:n, :k] = q
    groups = padded.view(blocks, 64, k4, 4).transpose(1, 2)
    sums = padded.sum(dim=1, dtype=torch.int32).view(blocks, 1, 64, 1).view(torch.int8)
    return torch.cat([groups, sums], dim=1).contiguous()


def median_ms(fn, copies) -> float:
    """Median of CALLS calls, each on the next copy of the weight (cold, as a step meets it)."""
    for c in copies[:2]:
        fn(c)
    times = []
    for i in range(CALLS):
        t0 = time.perf_counter()
        fn(copies[i % len(copies)])
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def time_build(path: str) -> dict:
    spec = importlib.util.spec_from_file_location("convs2s_kernels._C", path)
    C = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(C)
    torch.manual_seed(0)
    q8 = [torch.randint(-127, 128, (N, K), dtype=torch.int8) for _ in range(6)]
    packs = {id(q): w8a8_packed(q) for q in q8}
    nk = [torch.randn(N, K) for _ in range(3)]
    kn = [torch.randn(K, N) for _ in range(3)]
    kn_packed = [C.pack_kn_weight(w) for w in kn]
    s, b = torch.rand(N) * 0.01, torch.randn(N)
    out = {}
    for m in (1, 5, 12):
        x = torch.randn(m, K)
        cases = {
            "w8a8_reducing": (lambda q: C.linear_w8a8_with(x, q, s, b, 0, None, 8, 8), q8),
            "w8a8_packed_per_call": (lambda q: C.linear_w8a8_with(x, q, s, b, 1, None, 8, 8), q8),
            "w8a8_packed": (lambda q: C.linear_w8a8_with(x, q, s, b, 1, packs[id(q)], 8, 8), q8),
            "w7a8_packed": (lambda q: C.linear_w8a8_with(x, q, s, b, 1, packs[id(q)], 7, 8), q8),
            "int8_weights": (lambda q: C.small_gemm_int8(x, q, s, b), q8),
            "fp32_nk": (lambda w: C.small_gemm_nk(x, w, b), nk),
            "fp32_kn": (lambda w: C.small_gemm_kn(x, w, b), kn),
            "fp32_kn_packed": (lambda p: C.small_gemm_kn_packed(x, p, N, b), kn_packed),
        }
        for name, (fn, copies) in cases.items():
            out[f"{name}_M{m}"] = median_ms(fn, copies)
    out.update(decoder_step_cases(C))
    return out


def decoder_step_cases(C) -> dict:
    """The one-call decoder step (csrc/decoder_step_cpu.cpp) through convs2s_kernels bound to ``C``."""
    sys.modules["convs2s_kernels._C"] = C  # the package imports this build, not the installed one
    import convs2s_kernels as ck

    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # bench/: the suite's layers
    from test_bench_decoder_step import LAYERS, WIDTHS_IN, decoder_layers

    assert ck.extension.native() is C
    S, out = 30, {}
    for B, beam in ((1, 1), (1, 5)):
        N = B * beam
        copies = [decoder_layers(B, S, torch.float32, "cpu", packed=True) for _ in range(3)]
        x = torch.randn(N, WIDTHS_IN[0])
        states = [torch.randn(N, k - 1, c_in) for (_, k), c_in in zip(LAYERS, WIDTHS_IN)]
        emb, pad, lengths = torch.randn(B, beam, S), torch.zeros(B, S, dtype=torch.bool), torch.full((B,), S)
        parents = torch.arange(N).flip(0)

        def step(layers):
            with torch.no_grad():
                ck.decoder_step(x, states, layers, emb, pad, lengths, parents, backend="cpp")

        out[f"decoder_step_wmt_en_de_B{B}_beam{beam}"] = median_ms(step, copies)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("old"), p.add_argument("new")
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--json", help="write every round's medians here")
    p.add_argument("--one", help=argparse.SUPPRESS)  # child process: time this build
    args = p.parse_args()
    if args.one:
        print(json.dumps(time_build(args.one)))
        return 0
    runs = {"old": [], "new": []}
    for r in range(args.rounds):
        for which in (("old", "new") if r % 2 == 0 else ("new", "old")):
            out = subprocess.run([sys.executable, __file__, args.old, args.new, "--one", getattr(args, which)],
                                 check=True, capture_output=True, text=True).stdout
            runs[which].append(json.loads(out))
            print(f"round {r + 1}/{args.rounds}: {which} done", file=sys.stderr)
    print(f"| case | old ms (range) | new ms (range) | new/old | paired ratios |\n|---|---|---|---|---|")
    for k in runs["old"][0]:
        o, n = [x[k] for x in runs["old"]], [x[k] for x in runs["new"]]
        pr = [b / a for a, b in zip(o, n)]
        print(f"| {k} | {statistics.median(o):.3f} ({min(o):.3f}-{max(o):.3f}) | {statistics.median(n):.3f} "
              f"({min(n):.3f}-{max(n):.3f}) | {statistics.median(n) / statistics.median(o):.3f} | {min(pr):.2f}-{max(pr):.2f} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(runs, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
