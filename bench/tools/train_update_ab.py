"""Whole training updates of two source trees (two builds of the extension), side by side: each
round runs one process per tree (order alternated, ABBA), each timing the same updates
(``convs2s.train.Trainer.train_step``, the recipe's settings, a data folder's first batches after
warm-ups) under the same allocator; prints target tokens/s per round, the medians, and the
per-round ratio with its range. For a change to the training path (``csrc/``, the trainer).
With ``--conv-layer B,T,C`` each process times one conv+GLU layer's forward + backward instead
(``ck.conv_glu``, cpp, width 3, causal, bias, residual and the sqrt(1/2) scale, as the decoder
runs it in training), ``--updates`` calls: a pass-level change too small for whole updates to resolve.

    git worktree add /tmp/before <commit> && (cd /tmp/before && python3 setup.py build_ext --inplace)
    python3 bench/tools/train_update_ab.py DATA --before /tmp/before --after . [--rounds 5] [--updates 25]
                                           [--warmup 5] [--max-tokens 1000] [--arch fconv_iwslt_de_en] [--bf16] [--json OUT]
    python3 bench/tools/train_update_ab.py --conv-layer 62,16,256 --before /tmp/before --after . [--rounds 20] [--updates 30]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

# Both children time `step(i)` (it returns the tokens it ran) the same way: warm-ups counted by
# dispatch label, then `calls` timed calls.
TIMER = r"""
import json, sys, time
import torch
import convs2s_kernels as ck
torch.set_num_threads(2)
def time_calls(step, warmup, calls):
    with ck.count_dispatches() as counts:
        for i in range(warmup):
            step(i)
    tokens, t0 = 0, time.perf_counter()
    for i in range(warmup, warmup + calls):
        tokens += step(i)
    seconds = time.perf_counter() - t0
    print(json.dumps(dict(seconds=seconds, tokens=tokens, tok_s=tokens / seconds,
                          ran={f"{op} ({backend})": n for (op, backend), n in sorted(counts.items())})))
"""

CHILD = TIMER + r"""
import tempfile
from convs2s.train import Trainer, TrainConfig
data, arch, max_tokens, warmup, updates = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
bf16 = sys.argv[6] == "bf16"
with tempfile.TemporaryDirectory(prefix="train-update-ab-") as tmp:
    cfg = TrainConfig(data=data, save_dir=tmp, arch=arch, model_overrides={"dropout": 0.2}, max_tokens=max_tokens,
                      label_smoothing=0.1, clip_norm=0.1, threads=2, bf16=bf16)
    trainer = Trainer(cfg, log=lambda *a, **k: None)
    groups = trainer.epoch_groups(1)
    time_calls(lambda i: trainer.train_step(groups[i], 1, i)["ntokens"], warmup, updates)
"""

CONV_CHILD = TIMER + r"""
import math
(B, T, C), warmup, calls = map(int, sys.argv[1].split(",")), int(sys.argv[2]), int(sys.argv[3])
torch.manual_seed(0)
x = torch.randn(B, T, C, requires_grad=True)
w = (torch.randn(3, C, 2 * C) / math.sqrt(3 * C)).requires_grad_()
b, res = torch.zeros(2 * C, requires_grad=True), torch.randn(B, T, C, requires_grad=True)
dout = torch.randn(B, T, C)
def step(i):
    out = ck.conv_glu(x, w, b, causal=True, residual=res, scale=math.sqrt(0.5), backend="cpp")
    torch.autograd.grad(out, (x, w, b, res), dout)
    return B * T
time_calls(step, warmup, calls)
"""


def run_tree(tree: str, args) -> dict:
    from convs2s.allocator import find_library

    env = dict(os.environ, PYTHONPATH=os.pathsep.join([tree, os.path.join(tree, "bench")]))
    lib = find_library()
    if lib and lib not in env.get("LD_PRELOAD", ""):
        env["LD_PRELOAD"] = lib + (":" + env["LD_PRELOAD"] if env.get("LD_PRELOAD") else "")
    if args.conv_layer:
        cmd = [sys.executable, "-c", CONV_CHILD, args.conv_layer, str(args.warmup), str(args.updates)]
    else:
        cmd = [sys.executable, "-c", CHILD, args.data, args.arch, str(args.max_tokens), str(args.warmup),
               str(args.updates), "bf16" if args.bf16 else "fp32"]
    out = subprocess.run(cmd, env=env, cwd=tree, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"error: the {tree} process failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("data", nargs="?", help="a data folder written by `convs2s data prepare` (not with --conv-layer)")
    p.add_argument("--before", required=True, help="source tree with its extension built in place")
    p.add_argument("--after", required=True)
    p.add_argument("--arch", default="fconv_iwslt_de_en")
    p.add_argument("--max-tokens", type=int, default=1000)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--updates", type=int, default=25)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--conv-layer", metavar="B,T,C", help="time one conv+GLU layer's forward + backward instead")
    p.add_argument("--bf16", action="store_true", help="updates under bf16 autocast (`convs2s train --precision bf16`)")
    p.add_argument("--json")
    args = p.parse_args(argv)
    if not args.conv_layer and not args.data:
        p.error("give a data folder (DATA), or --conv-layer B,T,C")
    unit = "rows/s (a conv+GLU layer's forward + backward)" if args.conv_layer else "target tokens/s"
    trees = {"before": os.path.abspath(args.before), "after": os.path.abspath(args.after)}
    rates = {"before": [], "after": []}
    ran = {}
    for r in range(args.rounds):
        order = ("before", "after") if r % 2 == 0 else ("after", "before")
        for name in order:
            res = run_tree(trees[name], args)
            rates[name].append(res["tok_s"])
            ran[name] = res["ran"]
        print(f"round {r + 1}: before {rates['before'][-1]:,.0f}  after {rates['after'][-1]:,.0f} {unit}  "
              f"({rates['after'][-1] / rates['before'][-1]:.2f}x)", flush=True)
    ratios = [a / b for a, b in zip(rates["after"], rates["before"])]
    med = {k: statistics.median(v) for k, v in rates.items()}
    print(f"median: before {med['before']:,.0f}  after {med['after']:,.0f} {unit}; per round "
          f"{statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f})")
    for name in ("before", "after"):
        print(f"{name} ran: {', '.join(f'{k} x{v}' for k, v in ran[name].items())}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(what=f"{unit} of two trees, alternating processes (bench/tools/train_update_ab.py)",
                           unit=unit, args=vars(args), trees=trees, rates=rates, median=med,
                           per_round_ratio=ratios, ran=ran), f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
