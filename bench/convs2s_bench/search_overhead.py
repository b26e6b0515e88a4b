"""How much of a beam search's step is Python: the peer workload (equal-length batches, outputs
forced to round(1.1 x source) words, the default backend, folded attention) decoded once
without the profiler (wall time per step) and once under torch.profiler, whose top-level
events are the time spent inside ops (ATen and this project's C++ kernels); the rest of a step
is the interpreter's: the search loop, the model's Python, argument checks, dispatch.

    python3 -m convs2s_bench.search_overhead --checkpoint ckpt.pt \
        --input ../shared/peers/inputs/src64_len10-40_seed1_v8000.ids
    python3 -m convs2s_bench.search_overhead --arch fconv_iwslt_de_en --vocab 8000 --input ...  # random weights
"""

from __future__ import annotations

import argparse
import time
from typing import List, Optional

import torch

from convs2s.errors import Convs2sError
from convs2s.generate import Observer
from convs2s_kernels.env import machine_description

from .report import positive_ints, publish
from .vs_fairseq import plan_batches, read_ids


def _decode_all(model, sentences, batches, forced, beam: int) -> int:
    """Every batch once; returns the number of decoding steps."""
    from convs2s.generate import generate

    steps = [0]

    def count(step: int) -> None:
        steps[0] += step >= 0

    for b, f in zip(batches, forced):
        generate(model, [sentences[i] for i in b], beam=beam, nbest=beam, batch_size=len(b), max_len_a=0.0,
                 max_len_b=f, min_len=f, fold_attention=True, observer=Observer(on_step=count))
    return steps[0]


def _time_inside_ops(prof) -> float:
    """Seconds inside top-level profiler events (an op's children are inside its own time)."""
    return sum(e.cpu_time_total for e in prof.events() if e.cpu_parent is None) / 1e6


def measure(model, sentences, beam: int, repeats: int = 3) -> dict:
    batches, forced = plan_batches(sentences, 128)
    _decode_all(model, sentences, batches[:1], forced[:1], beam)  # warm-up (and kernel choice)
    walls = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        steps = _decode_all(model, sentences, batches, forced, beam)
        walls.append(time.perf_counter() - t0)
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        t0 = time.perf_counter()
        _decode_all(model, sentences, batches, forced, beam)
        profiled = time.perf_counter() - t0
    inside = _time_inside_ops(prof)
    wall = sorted(walls)[len(walls) // 2]
    return dict(beam=beam, batches=len(batches), steps=steps, wall_s=wall, wall_range_s=(min(walls), max(walls)),
                step_ms=1e3 * wall / steps, profiled_step_ms=1e3 * profiled / steps,
                inside_ops_step_ms=1e3 * inside / steps, python_step_ms=1e3 * (profiled - inside) / steps)


def format_result(arch: str, results: List[dict]) -> str:
    m = machine_description()
    caps = ", ".join(f"{k}={v}" for k, v in m["isa_caps"].items())
    isa = ", ".join(m["isa"]) + (f" (capped: {caps})" if caps else "")
    lines = [f"Python's share of a beam-search step, {arch} (peer workload, default backend, folded attention); "
             f"{m['cpu']}, {m['threads']} threads, {m['allocator']}, ISA {isa}.",
             "'Python' = the profiled step minus the time inside top-level ops (ATen, C++ kernels).", "",
             "| beam | batches | steps | step ms (no profiler) | profiled step ms | inside ops ms | Python ms |",
             "|---|---|---|---|---|---|---|"]
    for r in results:
        lines.append(f"| {r['beam']} | {r['batches']} | {r['steps']} | {r['step_ms']:.3f} "
                     f"| {r['profiled_step_ms']:.3f} | {r['inside_ops_step_ms']:.3f} | {r['python_step_ms']:.3f} |")
    return "\n".join(lines)


def _model(args):
    if args.checkpoint:
        from convs2s.fairseq_io import load_fairseq

        return load_fairseq(args.checkpoint)[0]
    from convs2s.model import build_model

    torch.manual_seed(0)
    return build_model(args.arch, args.vocab, args.vocab).fold_weight_norm().eval()


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python3 -m convs2s_bench.search_overhead", description=__doc__.split("\n\n")[0])
    p.add_argument("--input", required=True, help="sentences of word ids, one per line (the peer's inputs/)")
    p.add_argument("--checkpoint", help="a fairseq fconv checkpoint (else random weights of --arch)")
    p.add_argument("--arch", default="fconv_iwslt_de_en")
    p.add_argument("--vocab", type=int, default=8000, help="vocabulary of the random model")
    p.add_argument("--beams", default="1,5")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", help="also write the table to this markdown file")
    args = p.parse_args(argv)
    beams = positive_ints(p, "--beams", args.beams)
    if args.repeats < 1:
        p.error(f"--repeats must be at least 1, got {args.repeats}")
    try:
        model, sentences = _model(args), read_ids(args.input)
    except Convs2sError as exc:  # an unreadable input or checkpoint: one line, exit 2
        p.error(str(exc))
    publish(format_result(args.checkpoint or args.arch, [measure(model, sentences, b, args.repeats) for b in beams]),
            args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
