"""Where a training update's matrix products lose to the machine's GEMM peak: each product shape of
real updates (``convs2s.train.Trainer.train_step`` on a data folder's first batches) with its time
inside the update (``torch.profiler``, self time) and the same product timed alone on warm
operands, as GFLOP/s and as a fraction of the fp32 GEMM peak measured in the same run; and the
updates' products, each at the best speed its library showed at its shape (alone or inside the
update), beside the same updates unprofiled: how much faster an update could be with nothing
outside its products (without fewer products or faster GEMMs).

    python3 bench/tools/train_products.py DATA [--arch fconv_iwslt_de_en] [--max-tokens 1000] [--updates 15]
                                               [--top 15] [--json OUT]

A shape slow alone is the GEMM's (MKL at that shape); slow only inside the update, its operands'
(cold caches, layouts). Products are ``mm``, ``addmm``, ``addmm_``, ``bmm`` and oneDNN's
``mkldnn::_linear_pointwise``. The script re-executes itself under tcmalloc (as ``convs2s train``
runs): under glibc's malloc every large buffer is a fresh mapping whose first writer takes the
page faults, which the profile then charges to that op.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import statistics
import tempfile
import time
from collections import defaultdict

import torch

from convs2s_bench.roofline import gemm_peak_gflops

# (baddbmm can run as addmm_ calls: counted twice); oneDNN's inner product: X @ W^T
PRODUCTS = ("aten::mm", "aten::addmm", "aten::addmm_", "aten::bmm", "mkldnn::_linear_pointwise")


def product_flops(name: str, shapes) -> float:
    """FLOPs of one call from its input shapes (profiler ``record_shapes``)."""
    if name in ("aten::mm",):
        (m, k), (_, n) = shapes[0], shapes[1]
        return 2.0 * m * k * n
    if name in ("aten::addmm", "aten::addmm_"):
        (m, k), (_, n) = shapes[1], shapes[2]
        return 2.0 * m * k * n
    if name == "mkldnn::_linear_pointwise":
        (m, k), (n, _) = shapes[0], shapes[1]
        return 2.0 * m * k * n
    (b, m, k), (_, _, n) = shapes[0], shapes[1]  # bmm
    return 2.0 * b * m * k * n


def alone_seconds(name: str, shapes, repeats: int = 20):
    """(median, fastest) seconds of the product at these shapes on warm random operands."""
    ts = [torch.randn(s) if s else torch.tensor(1.0) for s in shapes[:3]]
    fn = {
        "aten::mm": lambda: torch.mm(ts[0], ts[1]),
        "aten::addmm": lambda: torch.addmm(ts[0], ts[1], ts[2]),
        "aten::addmm_": lambda: ts[0].addmm_(ts[1], ts[2]),
        "aten::bmm": lambda: torch.bmm(ts[0], ts[1]),
        "mkldnn::_linear_pointwise": lambda: torch.ops.mkldnn._linear_pointwise(ts[0], ts[1], None, "none", [], ""),
    }[name]
    for _ in range(3):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), min(times)


def allocator() -> str:
    with open("/proc/self/maps") as f:
        maps = f.read()
    return next((k for k in ("tcmalloc", "jemalloc") if k in maps), "glibc malloc")


def main(argv=None) -> int:
    from convs2s.allocator import find_library
    from convs2s.train import Trainer, TrainConfig

    lib = find_library()
    if argv is None and lib and allocator() == "glibc malloc" and not os.environ.get("TRAIN_PRODUCTS_REEXEC"):
        sys.stdout.flush()
        os.execve(sys.executable, [sys.executable, *sys.argv],
                  dict(os.environ, LD_PRELOAD=lib, TRAIN_PRODUCTS_REEXEC="1"))

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("data")
    p.add_argument("--arch", default="fconv_iwslt_de_en")
    p.add_argument("--max-tokens", type=int, default=1000)
    p.add_argument("--updates", type=int, default=15)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--top", type=int, default=15, help="ops outside the products listed")
    p.add_argument("--json")
    args = p.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="train-products-") as tmp:
        cfg = TrainConfig(data=args.data, save_dir=tmp, arch=args.arch, model_overrides={"dropout": 0.2},
                          max_tokens=args.max_tokens, label_smoothing=0.1, clip_norm=0.1)
        trainer = Trainer(cfg, log=lambda *a, **k: None)
        groups = trainer.epoch_groups(1)
        for i in range(args.warmup):
            trainer.train_step(groups[i], 1, i)
        peak = gemm_peak_gflops()
        t0 = time.perf_counter()  # the same batches unprofiled: the profiler's own cost stays out of the ceiling
        for i in range(args.updates):
            trainer.train_step(groups[args.warmup + i], 1, args.warmup + i)
        plain = time.perf_counter() - t0
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True) as prof:
            t0 = time.perf_counter()
            for i in range(args.updates):
                trainer.train_step(groups[args.warmup + i], 1, args.warmup + i)
            wall = time.perf_counter() - t0
    others = sorted(((ev.self_cpu_time_total / 1e6, ev.count, ev.key) for ev in prof.key_averages()
                     if ev.key not in PRODUCTS), reverse=True)
    rows = defaultdict(lambda: dict(calls=0, seconds=0.0, flops=0.0))
    for ev in prof.key_averages(group_by_input_shape=True):
        if ev.key not in PRODUCTS:
            continue
        shapes = [list(s) for s in ev.input_shapes]
        r = rows[(ev.key, json.dumps(shapes))]
        r["calls"] += ev.count
        r["seconds"] += ev.self_cpu_time_total / 1e6
        r["flops"] += ev.count * product_flops(ev.key, shapes)
    out = []
    for (name, shapes), r in rows.items():
        shp = json.loads(shapes)
        alone, fastest = alone_seconds(name, shp)
        per_call = r["flops"] / r["calls"]
        out.append(dict(op=name, shapes=shp, calls=r["calls"], seconds=r["seconds"], gflop=r["flops"] / 1e9,
                        gflops_s=r["flops"] / r["seconds"] / 1e9, alone_gflops_s=per_call / alone / 1e9,
                        best_gflops_s=max(per_call / fastest, r["flops"] / r["seconds"]) / 1e9))
    out.sort(key=lambda r: -r["seconds"])
    total_s = sum(r["seconds"] for r in out)
    total_f = sum(r["gflop"] for r in out)
    # each product at the best speed its library showed at its shape (alone or in the update), and
    # nothing else: the fastest these updates could run without fewer products or faster GEMMs
    alone_s = sum(r["gflop"] / r["best_gflops_s"] for r in out)
    print(f"{allocator()}; {args.updates} updates in {wall:.2f} s (profiled); products {total_s:.2f} s, {total_f:.1f} GFLOP, "
          f"{total_f / total_s:.0f} GFLOP/s = {total_f / total_s / peak:.0%} of the {peak:.0f} GFLOP/s GEMM peak")
    print(f"the same updates unprofiled: {plain:.2f} s; their products, each at its fastest here: {alone_s:.2f} s "
          f"({total_f / alone_s / peak:.0%} of the peak), {alone_s / plain:.0%} of it: with nothing else, "
          f"updates {plain / alone_s:.2f}x faster")
    print(f"{'op':14} {'shapes':44} {'calls':>5} {'s':>6} {'GFLOP':>6} {'GF/s':>5} {'alone':>5} {'peak':>5}")
    for r in out:
        if r["seconds"] < 0.005 * total_s:
            continue
        print(f"{r['op'].split('::')[-1][:14]:14} {str(r['shapes'][:3]):44.44} {r['calls']:5d} {r['seconds']:6.3f} {r['gflop']:6.2f} "
              f"{r['gflops_s']:5.0f} {r['alone_gflops_s']:5.0f} {r['gflops_s'] / peak:5.0%}")
    print(f"outside the products ({sum(o[0] for o in others):.2f} s of self time), the largest:")
    for seconds, calls, key in others[:args.top]:
        print(f"  {key:48.48} {calls:6d} calls {seconds:6.3f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(args=vars(args), allocator=allocator(), wall_s=wall, unprofiled_s=plain, gemm_peak_gflops=peak,
                           products_s=total_s, products_alone_s=alone_s, products=out,
                           others=[dict(op=k, calls=c, seconds=s) for s, c, k in others]), f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
