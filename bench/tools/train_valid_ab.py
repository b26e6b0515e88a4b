"""Training recipes side by side at equal wall time, judged on the validation set: how a
hyperparameter change of a time-bounded recipe (examples/multi30k/run.sh) is decided, never on a
test set.

    python3 bench/tools/train_valid_ab.py DATA --minutes 25 --decay-minutes 8 \\
        --arm "--max-tokens 1000 --validate-interval 400" --arm "--max-tokens 2000 --validate-interval 200" \\
        [--json OUT] [--work DIR] -- [options every arm shares, as for `convs2s train`]

Each arm is one `convs2s train` run of one thread, all arms at once (one per core: each has the
same machine for the same minutes), with --max-time/--decay-minutes from here so that every arm
ends annealed; then the validation perplexity of each final model. Prints, per arm, the updates,
epochs, median target tokens/s, the validation curve (perplexity at training minutes) and the
final perplexity; the JSON keeps all of it.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import List, Optional

RESULT = "valid_ab_result.json"


def run_arm(argv: List[str]) -> int:
    """In an arm's process: train as `convs2s train` does, then validate the final model."""
    from convs2s.cli import build_parser, train_config_from_args
    from convs2s.data import perplexity
    from convs2s.train import Trainer, init_distributed

    args = build_parser().parse_args(["train"] + argv)
    cfg = train_config_from_args(args)
    cfg.bf16 = args.precision == "bf16"  # no measuring: `auto` would time beside the other arms
    trainer = Trainer(cfg, init_distributed())
    summary = trainer.train(progress_bar=False)
    nll = trainer.validate()
    result = dict(updates=summary["updates"], epoch=summary["epoch"], reason=summary["reason"],
                  final_valid_ppl=perplexity(nll) if nll is not None else None)
    Path(cfg.save_dir, RESULT).write_text(json.dumps(result))
    return 0


def _arm_summary(save_dir: Path) -> dict:
    out = json.loads((save_dir / RESULT).read_text())
    records = [json.loads(line) for line in (save_dir / "train_log.jsonl").read_text().splitlines()]
    speeds = [r["tok_s"] for r in records if r["kind"] == "train"]
    out["tokens_per_s"] = statistics.median(speeds) if speeds else None
    out["valid"] = [dict(minutes=r["train_minutes"], update=r["update"], ppl=r["valid_ppl"])
                    for r in records if r["kind"] == "valid"]
    return out


def main(argv: Optional[List[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--arm-run"]:
        return run_arm(argv[1:])
    shared: List[str] = []
    if "--" in argv:
        shared = argv[argv.index("--") + 1:]
        argv = argv[:argv.index("--")]
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("data", help="a data folder written by `convs2s data prepare`")
    p.add_argument("--arm", action="append", required=True, help="one arm's own `convs2s train` options (quoted)")
    p.add_argument("--minutes", type=float, default=25.0, help="training minutes of every arm")
    p.add_argument("--decay-minutes", type=float, default=8.0, help="the lr annealed to zero over the last M minutes")
    p.add_argument("--work", help="folder for the arms' save dirs (default: a temporary one)")
    p.add_argument("--json", help="write the arms' results here")
    args = p.parse_args(argv)
    if len(args.arm) < 2:
        p.error("give at least two --arm")
    if not os.path.isdir(args.data):
        p.error(f"no data folder {args.data}")
    if not 0 < args.decay_minutes <= args.minutes:
        p.error("--decay-minutes must be in (0, --minutes]")
    work = Path(args.work or tempfile.mkdtemp(prefix="valid_ab_"))
    procs = []
    for i, arm in enumerate(args.arm):
        save = work / f"arm{i}"
        if save.exists() and any(save.iterdir()):
            p.error(f"{save} is not empty: give another --work")
        cmd = [sys.executable, str(Path(__file__).resolve()), "--arm-run", args.data, "--save-dir", str(save),
               "--max-time", f"{args.minutes:g}", "--decay-minutes", f"{args.decay_minutes:g}", "--threads", "1",
               *shared, *shlex.split(arm)]
        procs.append((arm, save, subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)))
    t0 = time.time()
    rows = []
    for arm, save, proc in procs:
        _, err = proc.communicate()
        if proc.returncode != 0:
            last = err.strip().splitlines()[-1] if err.strip() else f"exit status {proc.returncode}"
            print(f"error: arm {arm!r} failed: {last}", file=sys.stderr)
            for _, _, other in procs:
                other.kill()
            return 1
        rows.append(dict(arm=arm, save_dir=str(save), **_arm_summary(save)))
    print(f"{len(rows)} arms x {args.minutes:g} min (the last {args.decay_minutes:g} annealed), 1 thread each, "
          f"at once; shared options: {' '.join(shared) or '-'} ({(time.time() - t0) / 60:.1f} min wall)")
    print("| arm | updates | epochs | target tok/s | validation ppl (minutes) | final ppl |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        curve = ", ".join(f"{v['ppl']:.2f} ({v['minutes']:.1f})" for v in r["valid"]) or "-"
        speed = f"{r['tokens_per_s']:,.0f}" if r["tokens_per_s"] else "-"
        print(f"| `{r['arm']}` | {r['updates']} | {r['epoch']} | {speed} | {curve} | {r['final_valid_ppl']:.2f} |")
    if args.json:
        Path(args.json).write_text(json.dumps(dict(data=args.data, minutes=args.minutes, decay_minutes=args.decay_minutes,
                                                   shared=shared, arms=rows), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
