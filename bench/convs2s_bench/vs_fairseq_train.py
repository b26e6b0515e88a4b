"""``convs2s bench vs-fairseq-train``: fairseq's training updates and convs2s's side by side, from
the same initial weights on the same batches, with their first losses compared.

fairseq runs in its own interpreter (``--fairseq-python``) through
:mod:`convs2s_bench.fairseq_train_driver`: ``fairseq.trainer.Trainer.train_step`` with the
``label_smoothed_cross_entropy`` criterion and the ``nag`` optimizer, as ``fairseq-train`` runs
it. convs2s runs :meth:`convs2s.train.Trainer.train_step`, as ``convs2s train`` runs it. An
update is the whole of it on both sides: forward, backward, gradients divided by the target
tokens, clipped, the NAG step. Each repeat starts both from the initial weights, runs
``warmup`` untimed updates, then times one pass over the batches; repeats are interleaved
(fairseq, convs2s, convs2s, fairseq, ...). Model loading and fairseq's start are not timed.

The losses are compared in a separate pass with dropout 0 (the two draw different dropout
masks otherwise): the first ``check_updates`` updates from the initial weights, on both sides.
"""

from __future__ import annotations

import math
import os
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass, field
from typing import Dict, List, Optional

import torch

from convs2s.errors import Convs2sError

from .vs_fairseq import run_driver
from .workload import random_sentences


class VsFairseqTrainError(Convs2sError):
    """Bad options, or fairseq failed (the message carries its last error lines)."""


@dataclass
class TrainRequest:
    """What both sides train: the recipe's settings (fairseq's IWSLT fconv recipe, examples/multi30k)."""

    fairseq_python: str
    arch: str = "fconv_iwslt_de_en"
    data: Optional[str] = None  # a prepared data folder (its training split); None: random sentences
    max_tokens: int = 1000
    updates: int = 40  # timed updates per repeat (batches of the first epoch's order)
    warmup: int = 3
    repeats: int = 3
    check_updates: int = 3
    dropout: float = 0.2
    label_smoothing: float = 0.1
    lr: float = 0.25
    momentum: float = 0.99
    clip_norm: float = 0.1
    vocab: int = 8000  # random sentences only
    seed: int = 1
    backend: Optional[str] = None
    threads: int = field(default_factory=torch.get_num_threads)


# Random sentences' lengths (BPE tokens, EOS excluded) drawn like Multi30k's under the recipe's
# joint 8K BPE (examples/multi30k: 14.3 source and 14.8 target tokens on average).
MEAN_LENGTH, LENGTH_SPREAD, MAX_LENGTH = 14.3, 5.0, 60


def random_pairs(n: int, vocab: int, seed: int):
    gen = torch.Generator().manual_seed(seed)
    src_len = (torch.randn(n, generator=gen) * LENGTH_SPREAD + MEAN_LENGTH).round().clamp(3, MAX_LENGTH).long()
    tgt_len = (src_len.float() * 1.03 + torch.randn(n, generator=gen) * 2).round().clamp(3, MAX_LENGTH).long()
    return random_sentences(src_len.tolist(), vocab, seed), random_sentences(tgt_len.tolist(), vocab, seed + 1)


def _workload(req: TrainRequest, folder: str):
    """A data folder holding just the examples of the compared batches (the real Trainer reads a
    folder), and those batches as index lists into it."""
    from convs2s.data import TokenDataset, batch_by_tokens, open_data_folder, write_data_folder
    from convs2s.dictionary import Dictionary

    needed = max(req.updates, req.check_updates, req.warmup)
    if req.data:
        try:
            source = open_data_folder(req.data)
            full = source.load_split("train")
        except FileNotFoundError as exc:
            raise VsFairseqTrainError(f"--data: {exc}") from None
        src_dict, tgt_dict, langs = source.src_dict, source.tgt_dict, (source.src_lang, source.tgt_lang)
    else:
        # enough for every batch needed: a batch holds at most max_tokens / 4 sentences (3 words and EOS)
        src, tgt = random_pairs(needed * (req.max_tokens // 4 + 1), req.vocab, req.seed)
        full = TokenDataset(src, tgt)
        src_dict = tgt_dict = Dictionary([f"w{i}" for i in range(4, req.vocab)])
        langs = ("src", "tgt")
    batches = batch_by_tokens(full.src_lengths, full.tgt_lengths, req.max_tokens, seed=req.seed, epoch=1)
    if len(batches) < needed:
        raise VsFairseqTrainError(f"the data makes {len(batches)} batches of {req.max_tokens} tokens; "
                                  f"{needed} are needed (--updates, --check-updates, --warmup)")
    batches = batches[:needed]
    used = [i for b in batches for i in b]
    # EOS is part of what TokenDataset stores: the sentences without it
    sub = TokenDataset([full.source(i)[:-1].tolist() for i in used], [full.target(i)[:-1].tolist() for i in used])
    write_data_folder(folder, langs[0], langs[1], src_dict, tgt_dict, {"train": sub})
    starts = [0]
    for b in batches:
        starts.append(starts[-1] + len(b))
    return sub, [list(range(starts[k], starts[k + 1])) for k in range(len(batches))], langs


def _trainer(req: TrainRequest, data: str, save_dir: str, dropout: float, initial: Optional[dict]):
    from convs2s.train import Trainer, TrainConfig

    cfg = TrainConfig(data=data, save_dir=save_dir, arch=req.arch, model_overrides={"dropout": dropout}, lr=req.lr,
                      momentum=req.momentum, clip_norm=req.clip_norm, label_smoothing=req.label_smoothing,
                      max_tokens=req.max_tokens, seed=req.seed, threads=req.threads, backend=req.backend)
    trainer = Trainer(cfg, log=lambda *a, **k: None)
    if initial is not None:
        trainer.model.load_state_dict(initial)
    return trainer


def run_convs2s(req: TrainRequest, data: str, batches, initial: dict, dropout: float, warmup: int,
                timed: bool = True) -> dict:
    """One repeat: ``warmup`` untimed updates, then one timed pass over ``batches``."""
    import convs2s_kernels as ck

    with tempfile.TemporaryDirectory(prefix="vs-fairseq-train-") as tmp:
        trainer = _trainer(req, data, tmp, dropout, initial)
        with ck.count_dispatches() as counts:
            for i in range(warmup):
                trainer.train_step([batches[i % len(batches)]], 1, i)
        losses, gnorms = [], []
        t0 = time.perf_counter()
        for i, b in enumerate(batches):
            stats = trainer.train_step([b], 1, warmup + i)
            losses.append(stats["loss"])
            gnorms.append(stats["gnorm"])
        seconds = time.perf_counter() - t0
    return dict(seconds=seconds, losses=losses, gnorms=gnorms, ran=dict(counts))


def run_fairseq(req: TrainRequest, folder: str, langs, dataset, batches, dropout: float, warmup: int) -> dict:
    return run_driver(req.fairseq_python, "fairseq_train_driver.py", dict(
        folder=folder, source_lang=langs[0], target_lang=langs[1], arch=req.arch, dropout=dropout, lr=req.lr,
        momentum=req.momentum, clip_norm=req.clip_norm, label_smoothing=req.label_smoothing,
        max_tokens=req.max_tokens, seed=req.seed, threads=req.threads, warmup=warmup,
        sources=[dataset.source(i).tolist() for i in range(len(dataset))],
        targets=[dataset.target(i).tolist() for i in range(len(dataset))], batches=batches), VsFairseqTrainError)


def compare(req: TrainRequest, log=print, on_update=None) -> dict:
    """The loss check, then ``repeats`` interleaved timings of both systems; ``on_update(result)``
    after every repeat with the result so far (a long comparison keeps what it measured)."""
    import convs2s
    from convs2s.flops import training_flops
    from convs2s.train import winograd_tile_ran

    from .roofline import gemm_peak_gflops

    if not os.path.exists(req.fairseq_python):
        raise VsFairseqTrainError(f"--fairseq-python {req.fairseq_python} does not exist (build a fairseq venv "
                                  "with ../shared/peers/setup_fsq_venv.sh)")
    with tempfile.TemporaryDirectory(prefix="vs-fairseq-train-") as work:
        data = os.path.join(work, "bin")
        dataset, batches, langs = _workload(req, data)
        init = _trainer(req, data, os.path.join(work, "unused"), req.dropout, None)
        initial = {k: v.clone() for k, v in init.model.state_dict().items()}
        convs2s.save_fairseq(init.model, os.path.join(data, "model.pt"))
        model = init.model
        timed, check = batches[:req.updates], batches[:req.check_updates]
        tokens = sum(int(dataset.tgt_lengths[b].sum()) for b in timed)
        flops_run = lambda tile: sum(training_flops(model, dataset.src_lengths[b].tolist(),  # noqa: E731
                                                    dataset.tgt_lengths[b].tolist(), tile) for b in timed)
        flops = flops_run(0)  # the model's; fairseq runs them all
        log(f"loss check: {req.check_updates} updates, dropout 0")
        ours = run_convs2s(req, data, check, initial, 0.0, 0)
        theirs = run_fairseq(req, data, langs, dataset, check, 0.0, 0)
        times: Dict[str, List[float]] = {"fairseq": [], "convs2s": []}
        ran, fairseq_version, fairseq_allocator = {}, None, None
        peak = gemm_peak_gflops("cpu", torch.float32)  # beside the timings, before them

        def result():
            tile = winograd_tile_ran(ran)
            return _result(req, times, tokens, flops, peak, ours, theirs, ran, (fairseq_version, fairseq_allocator),
                           model, len(timed), flops_run(tile) if tile else flops)

        for rep in range(req.repeats):
            order = ("fairseq", "convs2s") if rep % 2 == 0 else ("convs2s", "fairseq")
            for system in order:
                if system == "convs2s":
                    out = run_convs2s(req, data, timed, initial, req.dropout, req.warmup)
                    ran = out["ran"]
                else:
                    out = run_fairseq(req, data, langs, dataset, timed, req.dropout, req.warmup)
                    fairseq_version, fairseq_allocator = out["fairseq"], out.get("allocator")
                times[system].append(out["seconds"])
                log(f"repeat {rep + 1}/{req.repeats} {system:<8} {out['seconds']:.2f} s "
                    f"({tokens / out['seconds']:,.0f} target tokens/s)")
            if on_update is not None:
                on_update(result())
    return result()


def _result(req, times, tokens, flops, peak, ours, theirs, ran, fairseq, model, n_updates, ours_run=None) -> dict:
    """``flops``: the model's over the timed batches (fairseq's products); ``ours_run``: the products
    convs2s ran (fewer where its convolutions ran Winograd tiles), which its fraction of the peak counts."""
    from convs2s_kernels.env import machine_description

    rows = {}
    for system, ts in times.items():
        rates = sorted(tokens / t for t in ts)
        rows[system] = dict(tokens_per_s=statistics.median(rates), min=rates[0], max=rates[-1], seconds=ts,
                            gflops_per_s=statistics.median(rates) * flops / tokens / 1e9)
        run = ours_run if system == "convs2s" and ours_run is not None else flops
        rows[system]["fraction_of_gemm_peak"] = statistics.median(rates) * run / tokens / 1e9 / peak
    ratios = sorted(f / c for f, c in zip(times["fairseq"], times["convs2s"]))  # per repeat, side by side
    diff = max(abs(a - b) / max(abs(b), 1e-12) for a, b in zip(ours["losses"], theirs["losses"]))
    served = {f"{op} ({backend})": n for (op, backend), n in ran.items()}  # count_dispatches' keys
    return dict(
        setup=dict(asdict(req), parameters=model.num_parameters(), updates=n_updates, target_tokens=tokens,
                   flops_per_target_token=flops / tokens,
                   convs2s_run_flops_per_target_token=(flops if ours_run is None else ours_run) / tokens,
                   fairseq_version=fairseq[0], fairseq_allocator=fairseq[1],
                   torch=torch.__version__),
        machine=machine_description("cpu"), gemm_peak_gflops=peak, rows=rows,
        # every product convs2s runs at the peak: the most it could train at, over fairseq's median
        ceiling=peak * 1e9 / ((flops if ours_run is None else ours_run) / tokens) / rows["fairseq"]["tokens_per_s"],
        speedup=dict(median=statistics.median(ratios), min=ratios[0], max=ratios[-1]),
        losses=dict(convs2s=ours["losses"], fairseq=theirs["losses"], gnorm_convs2s=ours["gnorms"],
                    gnorm_fairseq=theirs["gnorms"], max_relative_difference=diff),
        ran=dict(sorted(served.items())), measured=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()))


def losses_agree(result: dict, tolerance: float = 1e-4) -> bool:
    """The same model and loss: the first updates' losses equal within fp32 tolerance."""
    d = result["losses"]["max_relative_difference"]
    return math.isfinite(d) and d <= tolerance


def format_result(result: dict) -> str:
    s, m = result["setup"], result["machine"]
    data = s["data"] or f"random sentences ({s['vocab']:,}-word vocabularies, Multi30k's lengths)"
    lines = [f"{s['arch']} ({s['parameters']:,} parameters), {data}; {s['updates']} updates of at most "
             f"{s['max_tokens']:,} tokens ({s['target_tokens']:,} target tokens), dropout {s['dropout']:g}, "
             f"label smoothing {s['label_smoothing']:g}, NAG lr {s['lr']:g} momentum {s['momentum']:g}, clip "
             f"{s['clip_norm']:g}; {m['cpu']}, {s['threads']} threads, {', '.join(m['isa'])}; fairseq "
             f"{s['fairseq_version']} on {s.get('fairseq_allocator') or 'unknown'}, convs2s on {m['allocator']}, "
             f"torch {s['torch']}.",
             f"An update: {s['flops_per_target_token'] / 1e6:.1f} MFLOP per target token (forward + backward, 3x the "
             f"forward's products); fp32 GEMM peak measured in this run: {result['gemm_peak_gflops']:.0f} GFLOP/s.",
             *([f"convs2s runs {s['convs2s_run_flops_per_target_token'] / 1e6:.1f} MFLOP of products per target token "
                "(its width-3 convolutions as Winograd tiles); its fraction of the peak counts those."]
               if s.get("convs2s_run_flops_per_target_token", s["flops_per_target_token"])
               < s["flops_per_target_token"] else []),
             "", "| system | target tokens/s (median) | range | GFLOP/s | of GEMM peak |", "|---|---|---|---|---|"]
    for system, r in result["rows"].items():
        lines.append(f"| {system} | {r['tokens_per_s']:,.0f} | {r['min']:,.0f}–{r['max']:,.0f} | "
                     f"{r['gflops_per_s']:.1f} | {r['fraction_of_gemm_peak']:.0%} |")
    sp, ls = result["speedup"], result["losses"]
    lines += ["", f"convs2s / fairseq: {sp['median']:.2f}x (per repeat {sp['min']:.2f}–{sp['max']:.2f}x, "
                  f"{len(result['rows']['convs2s']['seconds'])} interleaved repeats)" +
                  (f"; every product convs2s runs at the peak would be {result['ceiling']:.2f}x"
                   if "ceiling" in result else ""),
              "first losses (dropout 0): convs2s " + " ".join(f"{x:.6f}" for x in ls["convs2s"]) +
              " | fairseq " + " ".join(f"{x:.6f}" for x in ls["fairseq"]) +
              f" (largest relative difference {ls['max_relative_difference']:.1e})",
              "convs2s ran: " + ", ".join(f"{k} x{v}" for k, v in result["ran"].items())]
    return "\n".join(lines)
