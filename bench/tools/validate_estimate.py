"""Hold the speed table's full-set estimates against full runs of the same configurations.

    python3 bench/tools/validate_estimate.py ESTIMATE.json FULL.json [FULL.json ...] > comparison.md

ESTIMATE.json is a default ``convs2s bench speed-table --json`` run; each FULL.json a ``--full``
run (any configurations and beams). For every (backend, decoder, dtype, beam) in both: the
estimate with its range and model uncertainty, the full run's time, and the estimate's error.
With the full run's per-batch times the same comparison is made per group of batch sizes (the
estimate's median repeat priced batch by batch), which shows where the cost model is off. Exit code 1 when an estimate is more than 10% off.
"""

import argparse
import json
import sys

TOLERANCE = 0.10
SIZE_GROUPS = ((1, 7), (8, 31), (32, 95), (96, 127), (128, 128))


def key(row):
    return row["backend"], row["decoder"], row["dtype"], row["beam"]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("estimate")
    p.add_argument("full", nargs="+")
    args = p.parse_args(argv)
    with open(args.estimate) as f:
        est = json.load(f)
    est_rows = {key(r): r for r in est["rows"]}
    lines = ["| backend | decoder | dtype | beam | estimate (s) | range (s) | ± model (s) | full run (s) | error |",
             "|---|---|---|---|---|---|---|---|---|"]
    groups, worst = [], 0.0
    for path in args.full:
        with open(path) as f:
            full = json.load(f)
        if full["setup"]["mode"] != "full" or full.get("partial"):
            raise SystemExit(f"{path} is not a finished --full run")
        for row in full["rows"]:
            e = est_rows.get(key(row))
            if e is None:
                continue
            err = e["seconds"] / row["seconds"] - 1
            worst = max(worst, abs(err))
            lines.append(f"| {row['label']} | {row['decoder']} | {row['dtype']} | {row['beam']} | {e['seconds']:.1f} | "
                         f"{e['seconds_min']:.1f}–{e['seconds_max']:.1f} | {e['model_uncertainty_s']:.1f} | "
                         f"{row['seconds']:.1f} | {100 * err:+.1f}% |")
            groups.append(by_size(e, row))
    lines += ["", "Per group of batch sizes (estimate's modelled seconds vs the full run's measured ones):", "",
              "| configuration | beam | " + " | ".join(f"{a}–{b} sentences" for a, b in SIZE_GROUPS) + " |",
              "|---|---|" + "---|" * len(SIZE_GROUPS)]
    lines += groups
    lines += ["", f"Largest error {100 * worst:.1f}% (tolerance {100 * TOLERANCE:.0f}%)."]
    print("\n".join(lines))
    return 0 if worst <= TOLERANCE else 1


def by_size(est_row, full_row) -> str:
    """Modelled against measured seconds per batch-size group: the full run's batches are the
    estimate's, so its per-batch times price the same list."""
    from convs2s_bench.estimate import Batch, BatchTiming, price
    from convs2s_bench.workload import forced_lengths

    rep = full_row["per_repeat"][0]
    batches = [Batch(tuple(range(n)), s, forced_lengths([[0] * s])[0]) for n, s in rep["batches"]]
    est_secs = est_row["seconds_per_repeat"]
    median_rep = sorted(range(len(est_secs)), key=est_secs.__getitem__)[len(est_secs) // 2]  # the median repeat
    timings = [BatchTiming(Batch(tuple(range(t["sentences"])), t["src_len"], t["steps"] - 1), t["prepare_s"],
                           t["step_s"]) for t in est_row["per_repeat"][median_rep]["sample"]]
    modelled = price(batches, timings)
    cells = []
    for lo, hi in SIZE_GROUPS:
        idx = [i for i, b in enumerate(batches) if lo <= b.size <= hi]
        m, f = sum(modelled[i] for i in idx), sum(rep["batch_seconds"][i] for i in idx)
        cells.append(f"{m:.0f} / {f:.0f} s ({100 * (m / f - 1):+.0f}%)" if f else "-")
    return f"| {full_row['label']} {full_row['decoder']} {full_row['dtype']} | {full_row['beam']} | " + \
        " | ".join(cells) + " |"


if __name__ == "__main__":
    sys.exit(main())
