"""Command line: ``python -m convs2s <command>`` (or the ``convs2s`` script).

Commands:
  demo      short beam-1 / beam-5 generation run of the paper's WMT'14 En-Fr architecture
            (random weights, fixed seed, synthetic newstest-like source lengths), per backend.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import List, Optional

import torch


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _int_list(text: str) -> List[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a comma-separated list of integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


def cmd_demo(args) -> int:
    import convs2s
    import convs2s_kernels as ck

    torch.manual_seed(args.seed)
    t0 = time.perf_counter()
    model = convs2s.build_model(args.arch, args.vocab, args.vocab).eval()
    build_s = time.perf_counter() - t0
    print(f"{args.arch}: {model.num_parameters():,} parameters ({args.vocab} / {args.vocab} vocabularies, "
          f"random weights, seed {args.seed}), built in {build_s:.1f} s; torch threads {torch.get_num_threads()}")
    gen = torch.Generator().manual_seed(args.seed)
    # Lengths near the newstest2012+2013 mean (22.95 tokens), a few sentences per length so that
    # the paper's equal-length batching has something to batch.
    lengths = [args.lengths[i % len(args.lengths)] for i in range(args.sentences)]
    sources = [torch.randint(4, args.vocab, (L,), generator=gen).tolist() for L in lengths]
    target = [int(round(1.1 * L)) for L in lengths]  # forced output length (random weights)
    avail = ck.available_backends()
    backends = [b for b in args.backends.split(",") if b]
    for b in backends:
        if b not in avail:
            print(f"error: unknown backend {b!r}; known: {', '.join(avail)}", file=sys.stderr)
            return 2
    print(f"{len(sources)} sentences, source lengths {sorted(set(lengths))}, output forced to ~1.1x source length")
    print(f"{'backend':<10} {'beam':>4} {'seconds':>8} {'sent/s':>7} {'tok/s':>7}")
    for backend in backends:
        if avail[backend] is not None:
            print(f"{backend:<10} skipped: {avail[backend]}")
            continue
        model.use_backend(backend)
        # warm-up outside the timing: first-call allocations and the cached weight-norm weights
        convs2s.generate(model, sources[:1], beam=1, max_len_b=2)
        for beam in args.beams:
            t0 = time.perf_counter()
            out = convs2s.generate(model, sources, beam=beam, max_len_a=1.2, max_len_b=10,
                                   batch_size=args.batch_size, eos_suppress_until=target)
            secs = time.perf_counter() - t0
            toks = sum(len(h[0]["tokens"]) for h in out)
            print(f"{backend:<10} {beam:>4} {secs:>8.2f} {len(out) / secs:>7.2f} {toks / secs:>7.1f}")
    model.use_backend(None)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="convs2s", description="ConvS2S on fused kernels")
    sub = parser.add_subparsers(dest="command", required=True)

    demo = sub.add_parser("demo", help="short generation run of the paper's En-Fr architecture (random weights)")
    demo.add_argument("--arch", default="fconv_wmt_en_fr")
    demo.add_argument("--vocab", type=_positive_int, default=40000, help="source and target vocabulary size")
    demo.add_argument("--sentences", type=_positive_int, default=8)
    demo.add_argument("--lengths", type=_int_list, default=[21, 23], help="source lengths to cycle through")
    demo.add_argument("--beams", type=_int_list, default=[1, 5])
    demo.add_argument("--backends", default="reference,cpp", help="comma-separated backends to time")
    demo.add_argument("--batch-size", type=_positive_int, default=128)
    demo.add_argument("--seed", type=int, default=1)
    demo.set_defaults(func=cmd_demo)
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
