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

With ``compile_modes`` (``torch.compile`` modes: ``default``, ``max-autotune-no-cudagraphs``) more
rows run beside them, what a user would try before convs2s's own kernels: the project's
``reference`` model eager (plain PyTorch ops), the same model compiled per mode, and fairseq's
model compiled per mode. A compiled reference is the train step unchanged with the model's forward
compiled in place (``nn.Module.compile``) and ``decoder.loss`` (fc3 and the loss, the other half of
what the step calls) compiled beside it; backward, clipping and the NAG step run as in the eager
row. It compiles in an untimed pass over every batch first (``compile_s``, graphs, graph breaks)
from the initial weights, whose first losses must equal the eager reference's on the same batches
at the same dropout: the project's dropout mask is a hash of a seed drawn from torch's generator,
which the compiled model draws as eager does (inductor's ``fallback_random``). Where the model as
it is fails to compile, or its losses differ, the row compiles it again with the dropout op kept
out of the graphs and says so. fairseq's compiled model is checked at dropout 0 against fairseq
eager, then compiles again in each timed repeat (its own process) in an untimed pass over the
batches. A failure is the row's result, in one line; the comparison goes on.
"""

from __future__ import annotations

import math
import os
import statistics
import tempfile
import time
from contextlib import contextmanager, nullcontext
from dataclasses import asdict, dataclass, field, replace
from typing import Dict, List, NamedTuple, Optional, Tuple

import torch

from convs2s.errors import Convs2sError

from .fairseq_train_driver import counted_since, dynamo_counts, failure_line
from .vs_fairseq import run_driver
from .workload import random_sentences

COMPILE_MODES = ("default", "max-autotune-no-cudagraphs")
REFERENCE_EAGER = "reference eager"
# the project's update beside the best compiled one: the bar it is meant to clear
COMPILED_TARGET = 1.3
# a compiled model's code cache holds, per function, a graph per shape kind and per mode: more
# than dynamo's default 8 across the modes of one run, past which it would run eager unannounced
RECOMPILE_LIMIT = 64


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
    compile_modes: Tuple[str, ...] = ()  # torch.compile modes of the compiled rows; none: no extra rows
    compile_fairseq: bool = True  # fairseq's model compiled too, per mode
    compile_backend: str = "inductor"  # torch.compile's backend (tests: aot_eager)


class Compiled(NamedTuple):
    """How a compiled row compiles: the mode, torch.compile's backend, and whether the project's
    dropout op runs outside the graphs."""

    mode: str
    backend: str = "inductor"
    dropout_eager: bool = False


def compiled_row(system: str, mode: str) -> str:
    """The row of ``system`` (``reference``, ``fairseq``) compiled in ``mode``."""
    return f"{system} compiled ({mode})"


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


_EAGER_DROPOUT: Dict[int, object] = {}  # the dropout op, kept out of the graphs: one wrapper, one guard


@contextmanager
def _compiling(spec: Optional[Compiled]):
    """The block's compiled model as ``spec`` says: a code cache large enough for every mode, and
    the project's dropout op outside the graphs where asked (restored after)."""
    if spec is None:
        yield
        return
    import torch._dynamo
    import torch._inductor.config

    import convs2s_kernels as ck

    original = ck.dropout
    if spec.dropout_eager:
        ck.dropout = _EAGER_DROPOUT.setdefault(id(original), torch.compiler.disable(original))
    try:
        # a run's compilation independent of earlier ones (dynamo's saved profiles of which sizes vary),
        # and the dropout seeds drawn from torch's generator as eager draws them: the same masks
        with torch._dynamo.config.patch(recompile_limit=RECOMPILE_LIMIT, automatic_dynamic_local_pgo=False), \
                torch._inductor.config.patch(fallback_random=True):
            yield
    finally:
        ck.dropout = original


def compile_model(model, spec: Compiled) -> None:
    """The model as a user would compile it: its forward in place (``nn.Module.compile``) and
    ``decoder.loss``, the fc3 and the loss that the train step calls beside the forward."""
    options = dict(backend=spec.backend, **({} if spec.mode == "default" else {"mode": spec.mode}))
    model.compile(**options)
    model.decoder.loss = torch.compile(model.decoder.loss, **options)


def run_convs2s(req: TrainRequest, data: str, batches, initial: dict, dropout: float, warmup: int,
                timed: bool = True, compiled: Optional[Compiled] = None) -> dict:
    """One repeat: ``warmup`` untimed updates, then (``timed``) one timed pass over ``batches``;
    ``compiled``: the model compiled so first (the untimed updates then compile it)."""
    import convs2s_kernels as ck

    with tempfile.TemporaryDirectory(prefix="vs-fairseq-train-") as tmp, _compiling(compiled):
        trainer = _trainer(req, data, tmp, dropout, initial)
        if compiled is not None:
            compile_model(trainer.model, compiled)
        before, warm, first = dynamo_counts(), [], None
        t0 = time.perf_counter()
        # not counted when compiled: dynamo guards on the open counting blocks, and the timed pass has none
        with ck.count_dispatches() if compiled is None else nullcontext({}) as counts:
            for i in range(warmup):
                warm.append(trainer.train_step([batches[i % len(batches)]], 1, i)["loss"])
                if first is None:  # the first update compiles every graph once (later ones: other shapes)
                    first, first_counts = time.perf_counter() - t0, dynamo_counts()
        warm_s, after = time.perf_counter() - t0, dynamo_counts()
        losses, gnorms = [], []
        t0 = time.perf_counter()
        for i, b in enumerate(batches if timed else []):
            stats = trainer.train_step([b], 1, warmup + i)
            losses.append(stats["loss"])
            gnorms.append(stats["gnorm"])
        seconds = time.perf_counter() - t0
    return dict(seconds=seconds, losses=losses, gnorms=gnorms, ran=dict(counts), warmup_losses=warm,
                warmup_seconds=warm_s, first_update_seconds=first, compiled=counted_since(before, after),
                first_update=counted_since(before, first_counts) if warmup else None,
                graphs_in_timed_pass=counted_since(after, dynamo_counts())["graphs"])


def run_fairseq(req: TrainRequest, folder: str, langs, dataset, batches, dropout: float, warmup: int,
                compile_mode: Optional[str] = None) -> dict:
    """fairseq's side of a repeat in its own interpreter; ``compile_mode``: its model compiled (a
    failure comes back as the result's ``error``)."""
    return run_driver(req.fairseq_python, "fairseq_train_driver.py", dict(
        folder=folder, source_lang=langs[0], target_lang=langs[1], arch=req.arch, dropout=dropout, lr=req.lr,
        momentum=req.momentum, clip_norm=req.clip_norm, label_smoothing=req.label_smoothing,
        max_tokens=req.max_tokens, seed=req.seed, threads=req.threads, warmup=warmup,
        sources=[dataset.source(i).tolist() for i in range(len(dataset))],
        targets=[dataset.target(i).tolist() for i in range(len(dataset))], batches=batches,
        **({"compile": compile_mode, "compile_backend": req.compile_backend} if compile_mode else {})),
        VsFairseqTrainError)


def compare(req: TrainRequest, log=print, on_update=None) -> dict:
    """The loss check (and the compiled rows' compilation), then ``repeats`` interleaved timings of
    every row; ``on_update(result)`` after every repeat with the result so far (a long comparison
    keeps what it measured)."""
    if not os.path.exists(req.fairseq_python):
        raise VsFairseqTrainError(f"--fairseq-python {req.fairseq_python} does not exist (build a fairseq venv "
                                  "with ../shared/peers/setup_fsq_venv.sh)")
    import torch._inductor

    unknown = [m for m in req.compile_modes if m not in torch._inductor.list_mode_options()]
    if unknown:
        raise VsFairseqTrainError(f"--compile-modes: unknown torch.compile mode {unknown[0]!r} (choose from "
                                  f"{', '.join(torch._inductor.list_mode_options())}, or none)")
    with tempfile.TemporaryDirectory(prefix="vs-fairseq-train-") as work:
        run = _Comparison(req, work, log)
        run.check_losses()
        if req.compile_modes:
            run.compile_rows()
        run.measure_peak()  # beside the timings, before them
        for rep in range(req.repeats):
            run.repeat(rep)
            if on_update is not None:
                on_update(run.result())
    return run.result()


class _Comparison:
    """One comparison's workload, initial weights, and what each row measured so far."""

    def __init__(self, req: TrainRequest, work: str, log):
        import convs2s

        self.req, self.log = req, log
        self.ref_req = replace(req, backend="reference")
        self.data = os.path.join(work, "bin")
        self.dataset, self.batches, self.langs = _workload(req, self.data)
        init = _trainer(req, self.data, os.path.join(work, "unused"), req.dropout, None)
        self.initial = {k: v.clone() for k, v in init.model.state_dict().items()}
        convs2s.save_fairseq(init.model, os.path.join(self.data, "model.pt"))
        self.model = init.model
        self.timed, self.check = self.batches[:req.updates], self.batches[:req.check_updates]
        self.tokens = sum(int(self.dataset.tgt_lengths[b].sum()) for b in self.timed)
        self.flops = self.flops_run(0)  # the model's; fairseq runs them all
        self.times: Dict[str, List[float]] = {"fairseq": [], "convs2s": []}
        self.extra: Dict[str, dict] = {}  # the added rows: what they are, their compilation and check
        self.specs: Dict[str, Compiled] = {}
        self.ran, self.fairseq, self.peak = {}, (None, None), float("nan")
        self.ours = self.theirs = None

    def flops_run(self, tile: int) -> float:
        from convs2s.flops import training_flops

        return sum(training_flops(self.model, self.dataset.src_lengths[b].tolist(),
                                  self.dataset.tgt_lengths[b].tolist(), tile) for b in self.timed)

    def check_losses(self) -> None:
        self.log(f"loss check: {self.req.check_updates} updates, dropout 0")
        self.ours = run_convs2s(self.req, self.data, self.check, self.initial, 0.0, 0)
        self.theirs = run_fairseq(self.req, self.data, self.langs, self.dataset, self.check, 0.0, 0)

    def measure_peak(self) -> None:
        from .roofline import gemm_peak_gflops

        self.peak = gemm_peak_gflops("cpu", torch.float32)

    def compile_rows(self) -> None:
        """The reference eager row, and each mode's compiled rows: compiled now, untimed, and checked."""
        req = self.req
        self.times[REFERENCE_EAGER] = []
        self.extra[REFERENCE_EAGER] = dict(system="reference", compile_mode=None)
        # the compiled reference's first losses, from the same weights, batches and dropout masks
        masked = run_convs2s(self.ref_req, self.data, self.check, self.initial, req.dropout, 0)["losses"]
        for mode in req.compile_modes:
            name = compiled_row("reference", mode)
            self.log(f"{name}: compiling (an untimed pass over {len(self.batches)} updates)")
            self._add_row(name, self._compile_reference(mode, masked))
        for mode in req.compile_modes if req.compile_fairseq else ():
            name = compiled_row("fairseq", mode)
            self.log(f"{name}: loss check, dropout 0 (compiling)")
            out = run_fairseq(req, self.data, self.langs, self.dataset, self.check, 0.0, 0, compile_mode=mode)
            info = dict(system="fairseq", compile_mode=mode, check_dropout=0.0, error=out.get("error"),
                        check_graphs=out.get("graphs"), graph_breaks=out.get("graph_breaks"),
                        break_reasons=out.get("break_reasons"), losses=out["losses"][:len(self.check)])
            self._add_row(name, _agreement(info, self.theirs["losses"]))

    def _add_row(self, name: str, info: dict) -> None:
        self.extra[name] = info
        if info.get("error"):
            self.log(f"{name}: failed: {info['error']}")
        else:
            self.times[name] = []

    def _compile_reference(self, mode: str, eager: List[float]) -> dict:
        """A compiled reference, compiled and checked (:meth:`_compile_pass`): first the model as it
        is, as a user would try; where that fails, or its losses differ, with dropout on, again with
        the project's dropout op outside the graphs (the row then says why)."""
        name = compiled_row("reference", mode)
        info = self._compile_pass(mode, False, eager)
        if self.req.dropout > 0 and (info.get("error") or not info["losses_agree"]):
            why = info.get("error") or (f"compiled, but its first losses differ from eager's by "
                                        f"{info['max_relative_difference']:.1e}")
            self.log(f"{name}: the model as it is: {why}; again with the dropout op kept eager")
            info = dict(self._compile_pass(mode, True, eager), first_try_error=why)
        if not info.get("error"):
            self.specs[name] = Compiled(mode, self.req.compile_backend, info["dropout_eager"])
        return info

    def _compile_pass(self, mode: str, dropout_eager: bool, eager: List[float]) -> dict:
        """A fresh compiled reference over every batch from the initial weights, untimed: its
        compilation, and its first losses against the ``eager`` reference's (same batches, same masks)."""
        spec = Compiled(mode, self.req.compile_backend, dropout_eager)
        info = dict(system="reference", compile_mode=mode, dropout_eager=dropout_eager, check_dropout=self.req.dropout)
        try:
            out = run_convs2s(self.ref_req, self.data, self.batches, self.initial, self.req.dropout,
                              len(self.batches), timed=False, compiled=spec)
        except Exception as exc:  # noqa: BLE001  (a failure is the row's result)
            return dict(info, error=failure_line(exc))
        first = out["first_update"]
        return _agreement(dict(info, compile_s=out["warmup_seconds"], compile_updates=len(self.batches),
                               first_update_s=out["first_update_seconds"], graphs=out["compiled"]["graphs"],
                               graph_breaks=first["graph_breaks"], break_reasons=first["break_reasons"],
                               losses=out["warmup_losses"][:len(self.check)], graphs_in_timed_pass=0), eager)

    def repeat(self, rep: int) -> None:
        """One timed pass of every row still standing, in an order that alternates per repeat."""
        names = [n for n in self.times if not self.extra.get(n, {}).get("error")]
        for name in names if rep % 2 == 0 else names[::-1]:
            out = self._run_row(name)
            if out.get("error"):
                self.extra[name]["error"] = out["error"]
                self.log(f"repeat {rep + 1}/{self.req.repeats} {name}: failed: {out['error']}")
                continue
            self.times[name].append(out["seconds"])
            self.log(f"repeat {rep + 1}/{self.req.repeats} {name:<8} {out['seconds']:.2f} s "
                     f"({self.tokens / out['seconds']:,.0f} target tokens/s)")

    def _run_row(self, name: str) -> dict:
        req, info = self.req, self.extra.get(name, {})
        if name == "fairseq" or info.get("system") == "fairseq":
            mode = info.get("compile_mode")
            warmup = max(req.warmup, len(self.timed)) if mode else req.warmup  # compiled: every shape first
            out = run_fairseq(req, self.data, self.langs, self.dataset, self.timed, req.dropout, warmup, mode)
            if mode is None:
                self.fairseq = (out["fairseq"], out.get("allocator"))
            elif not out.get("error"):
                info.setdefault("compile_s_per_repeat", []).append(out["warmup_seconds"])
                info.setdefault("compile_s", out["warmup_seconds"])
                info.setdefault("first_update_s", out["first_update_seconds"])
                info.update(compile_updates=warmup, graphs=out["graphs"], graph_breaks=out["graph_breaks"],
                            graphs_in_timed_pass=info.get("graphs_in_timed_pass", 0) + out["graphs_in_timed_pass"])
            return out
        spec = self.specs.get(name)
        try:
            out = run_convs2s(req if name == "convs2s" else self.ref_req, self.data, self.timed, self.initial,
                              req.dropout, req.warmup, compiled=spec)
        except Exception as exc:  # noqa: BLE001  (a compiled row's failure is its result)
            if spec is None:
                raise
            return dict(error=failure_line(exc))
        if name == "convs2s":
            self.ran = out["ran"]
        if spec is not None:
            info["graphs_in_timed_pass"] += out["graphs_in_timed_pass"]
        return out

    def result(self) -> dict:
        from convs2s.train import winograd_tile_ran

        tile = winograd_tile_ran(self.ran)
        return _result(self.req, self.times, self.tokens, self.flops, self.peak, self.ours, self.theirs, self.ran,
                       self.fairseq, self.model, len(self.timed), self.flops_run(tile) if tile else self.flops,
                       extra=self.extra)


def _agreement(info: dict, eager: List[float], tolerance: float = 1e-4) -> dict:
    """``info`` with its first losses' largest relative difference from the eager ``losses``."""
    got = [] if info.get("error") else info.get("losses") or []
    diffs = [abs(a - b) / max(abs(b), 1e-12) for a, b in zip(got, eager)]
    diff = max(diffs) if diffs else None
    return dict(info, eager_losses=list(eager[:len(got)]), max_relative_difference=diff,
                losses_agree=diff is not None and math.isfinite(diff) and diff <= tolerance)


def _result(req, times, tokens, flops, peak, ours, theirs, ran, fairseq, model, n_updates, ours_run=None,
            extra=None) -> dict:
    """``flops``: the model's over the timed batches (fairseq's products); ``ours_run``: the products
    convs2s ran (fewer where its convolutions ran Winograd tiles), which its fraction of the peak counts;
    ``extra``: the added rows' descriptions (compilation, check, failure), merged into their rows."""
    from convs2s_kernels.env import machine_description

    rows = {}
    for system, ts in times.items():
        if not ts:  # a row that failed before its first timing: its description alone
            continue
        rates = sorted(tokens / t for t in ts)
        rows[system] = dict(tokens_per_s=statistics.median(rates), min=rates[0], max=rates[-1], seconds=ts,
                            gflops_per_s=statistics.median(rates) * flops / tokens / 1e9)
        run = ours_run if system == "convs2s" and ours_run is not None else flops
        rows[system]["fraction_of_gemm_peak"] = statistics.median(rates) * run / tokens / 1e9 / peak
    _add_extra_rows(rows, times, extra or {}, n_updates)
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
        ran=dict(sorted(served.items())), measured=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        **({"compiled": _best_compiled(rows)} if req.compile_modes else {}))


def _add_extra_rows(rows: dict, times: dict, extra: dict, n_updates: int) -> None:
    """The added rows' descriptions merged in, and every row's time over convs2s's, per repeat (how
    many times faster the project's own update is)."""
    for name, info in extra.items():
        rows[name] = dict(rows.get(name, dict(tokens_per_s=None, seconds=[])), **info)
        seconds = rows[name]["seconds"]
        if info.get("compile_s") is not None and seconds:  # the pass's time beyond its updates', compiled
            per_update = statistics.median(seconds) / n_updates
            rows[name]["compile_overhead_s"] = info["compile_s"] - info["compile_updates"] * per_update
    for name, row in rows.items():
        paired = [t / c for t, c in zip(times.get(name, []), times["convs2s"])]
        if name != "convs2s" and paired:
            paired.sort()
            row["convs2s_speedup"] = dict(median=statistics.median(paired), min=paired[0], max=paired[-1])


def _best_compiled(rows: dict) -> Optional[dict]:
    """The fastest compiled row whose first losses agree with its eager twin's, and how many times
    faster convs2s's own update is than it (the target: ``COMPILED_TARGET``); None when none ran."""
    ok = {n: r for n, r in rows.items() if r.get("compile_mode") and r.get("tokens_per_s") and r.get("losses_agree")}
    if not ok:
        return None
    best = max(ok, key=lambda n: ok[n]["tokens_per_s"])
    speedup = ok[best]["convs2s_speedup"]["median"]
    return dict(best=best, tokens_per_s=ok[best]["tokens_per_s"], convs2s_speedup=speedup, target=COMPILED_TARGET,
                met=speedup >= COMPILED_TARGET)


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
             "", "| system | target tokens/s (median) | range | GFLOP/s | of GEMM peak | convs2s is |",
             "|---|---|---|---|---|---|"]
    lines += [_table_row(system, r) for system, r in result["rows"].items()]
    sp, ls = result["speedup"], result["losses"]
    lines += ["", f"convs2s / fairseq: {sp['median']:.2f}x (per repeat {sp['min']:.2f}–{sp['max']:.2f}x, "
                  f"{len(result['rows']['convs2s']['seconds'])} interleaved repeats)" +
                  (f"; every product convs2s runs at the peak would be {result['ceiling']:.2f}x"
                   if "ceiling" in result else ""),
              "first losses (dropout 0): convs2s " + " ".join(f"{x:.6f}" for x in ls["convs2s"]) +
              " | fairseq " + " ".join(f"{x:.6f}" for x in ls["fairseq"]) +
              f" (largest relative difference {ls['max_relative_difference']:.1e})",
              "convs2s ran: " + ", ".join(f"{k} x{v}" for k, v in result["ran"].items())]
    lines += [_describe_row(name, r) for name, r in result["rows"].items() if "system" in r]
    if "compiled" in result:
        lines.append(_describe_best(result["compiled"]))
    return "\n".join(lines)


def _table_row(system: str, r: dict) -> str:
    if not r.get("tokens_per_s"):
        return f"| {system} | failed | | | | |"
    sp = r.get("convs2s_speedup")
    faster = f"{sp['median']:.2f}x faster" if sp else ""
    return (f"| {system} | {r['tokens_per_s']:,.0f} | {r['min']:,.0f}–{r['max']:,.0f} | {r['gflops_per_s']:.1f} | "
            f"{r['fraction_of_gemm_peak']:.0%} | {faster} |")


def _describe_row(name: str, r: dict) -> str:
    """An added row in one line: how it compiled (or failed), its graphs, its loss check."""
    if r.get("compile_mode") is None:
        return f"{name}: convs2s's model on the reference backend (plain PyTorch ops), eager"
    parts = [f"{name}:"]
    if r.get("first_try_error"):
        parts.append(f"the model as it is failed ({r['first_try_error']}); the dropout op kept out of the graphs;")
    if r.get("compile_s") is not None:
        parts.append(f"compiled in {r['compile_s']:.0f} s (an untimed pass of {r['compile_updates']} updates, "
                     + (f"the first {r['first_update_s']:.0f} s, " if r.get("first_update_s") is not None else "")
                     + (f"{r['compile_overhead_s']:.0f} s beyond running them), " if "compile_overhead_s" in r
                        else "") +
                     f"{r.get('graphs')} graphs, {r.get('graph_breaks')} graph breaks"
                     + (f" ({'; '.join(f'{k} x{n}' for k, n in r['break_reasons'].items())})"
                        if r.get("break_reasons") else "")
                     + f", {r.get('graphs_in_timed_pass', 0)} graphs compiled in the timed passes;")
    if r.get("compile_s_per_repeat"):
        parts.append("compiled again each repeat: " + ", ".join(f"{x:.0f} s" for x in r["compile_s_per_repeat"]) + ";")
    if r.get("max_relative_difference") is not None:
        parts.append(f"first losses (dropout {r['check_dropout']:g}) vs eager: largest relative difference "
                     f"{r['max_relative_difference']:.1e}{'' if r['losses_agree'] else ' (DISAGREE)'}")
    if r.get("error"):
        parts.append(f"FAILED: {r['error']}")
    return " ".join(parts)


def _describe_best(best: Optional[dict]) -> str:
    if best is None:
        return "no compiled row ran (with first losses agreeing): no convs2s / best compiled ratio"
    return (f"best compiled row: {best['best']}, {best['tokens_per_s']:,.0f} target tokens/s; convs2s / best "
            f"compiled: {best['convs2s_speedup']:.2f}x (target {best['target']:g}x: "
            f"{'met' if best['met'] else 'NOT met'})")
