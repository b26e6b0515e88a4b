"""Training updates per second with one backend beside another (issue 51's whole-step ratio):
the same model, weights and batches, forward + backward + gradient clip + NAG step as
``convs2s train`` takes them, backends alternated round by round in one process.

    python3 bench/tools/train_step_ab.py [--arch fconv_wmt_en_fr] [--backends triton,reference] [--precision bf16]
                                         [--sentences 160 --length 25] [--rounds 5 --updates 10] [--json OUT]

Random weights and tokens (the speed of a step does not depend on them), the paper's batches by
default: 160 sentences of 25 source and 25 target tokens (4,000 tokens). Prints target tokens/s
per backend (median over rounds, with the range), the ratio to the last backend named, and the
ops each backend ran (labelled by what actually served them).
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import time
from collections import Counter
from typing import Dict, List

import torch

import convs2s
import convs2s_kernels as ck
from convs2s.data import TokenDataset, collate
from convs2s.train import batch_loss
from convs2s_bench.roofline import sync
from convs2s_bench.workload import random_sentences


class Runner:
    """One backend's model copy and optimizer, stepping on fixed batches."""

    def __init__(self, model, backend: str, batches, bf16: bool, device: torch.device):
        self.model = copy.deepcopy(model).use_backend(backend).train()
        self.batches, self.bf16, self.device = batches, bf16, device
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.25, momentum=0.99, nesterov=True)
        self.dispatched: Counter = Counter()

    def update(self, batch) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.bf16):
            loss, _ = batch_loss(self.model, batch, 0.1)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 0.1)
        self.optimizer.step()

    def warm_up(self, updates: int) -> None:
        """Untimed updates (compiling, tuning, allocating), which also record the ops that ran."""
        with ck.count_dispatches() as counts:
            self.round(updates)
        self.dispatched.update(counts)

    def round(self, updates: int) -> float:
        """Seconds for ``updates`` updates."""
        sync(self.device)
        t0 = time.perf_counter()
        for i in range(updates):
            self.update(self.batches[i % len(self.batches)])
        sync(self.device)
        return time.perf_counter() - t0


def random_batches(n: int, sentences: int, length: int, vocab: int, device: torch.device, seed: int):
    """``n`` batches of ``sentences`` random sentences, ``length`` tokens each with EOS, collated as
    ``convs2s train`` collates them."""
    words = [length - 1] * (n * sentences)
    data = TokenDataset(random_sentences(words, vocab, seed), random_sentences(words, vocab, seed + 1))
    return [collate(data, range(i * sentences, (i + 1) * sentences)).to(device) for i in range(n)]


def run(args) -> Dict:
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    torch.manual_seed(args.seed)
    model = convs2s.build_model(args.arch, args.vocab, args.vocab).to(device)
    batches = random_batches(2, args.sentences, args.length, args.vocab, device, args.seed)
    runners = {b: Runner(model, b, batches, args.precision == "bf16", device) for b in args.backends}
    for r in runners.values():
        r.warm_up(2)
    times: Dict[str, List[float]] = {b: [] for b in runners}
    for i in range(args.rounds):  # alternated, the order flipped every round
        for b in (args.backends if i % 2 == 0 else args.backends[::-1]):
            times[b].append(runners[b].round(args.updates))
    tokens = args.updates * args.sentences * args.length
    rows = {}
    for b, ts in times.items():
        rates = sorted(tokens / t for t in ts)
        served = Counter()
        for (op, backend), n in runners[b].dispatched.items():
            served[f"{op} ({backend})"] += n
        rows[b] = dict(tokens_per_s=statistics.median(rates), min=rates[0], max=rates[-1], rounds=ts,
                       ran=dict(sorted(served.items())))
    base = args.backends[-1]
    for b in rows:
        rows[b]["ratio_to_" + base] = rows[b]["tokens_per_s"] / rows[base]["tokens_per_s"]
    return dict(arch=args.arch, device=str(device), gpu=torch.cuda.get_device_name(device) if device.type == "cuda"
                else None, precision=args.precision, sentences=args.sentences, length=args.length, vocab=args.vocab,
                updates_per_round=args.updates, rounds=args.rounds, torch=torch.__version__, rows=rows,
                measured=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--arch", default="fconv_wmt_en_fr")
    p.add_argument("--backends", type=lambda t: [s for s in t.split(",") if s], default=["triton", "reference"])
    p.add_argument("--device", default=None, help="default: cuda when there is one")
    p.add_argument("--precision", choices=("bf16", "fp32"), default="bf16")
    p.add_argument("--sentences", type=int, default=160)
    p.add_argument("--length", type=int, default=25)
    p.add_argument("--vocab", type=int, default=40000)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--updates", type=int, default=10, help="updates per timed round")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--json", help="write the result here too")
    args = p.parse_args(argv)
    if len(args.backends) < 2 or len(set(args.backends)) != len(args.backends):
        p.error("--backends needs two or more distinct names, e.g. triton,reference")
    if args.rounds < 1 or args.updates < 1 or args.sentences < 1 or args.length < 2:
        p.error("--rounds, --updates and --sentences must be >= 1, --length >= 2")
    result = run(args)
    base = args.backends[-1]
    print(f"{result['arch']} on {result['gpu'] or result['device']}, {args.precision}, batches of "
          f"{args.sentences} x {args.length} tokens, {args.rounds} rounds of {args.updates} updates")
    for b, row in result["rows"].items():
        print(f"  {b:10s} {row['tokens_per_s']:10.0f} target tok/s ({row['min']:.0f}-{row['max']:.0f})  "
              f"{row['ratio_to_' + base]:.2f}x {base}  ran: {', '.join(row['ran'])}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
            f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
