"""The paper's generation-speed table (Table 3): the time to translate newstest2012+2013 (6003
sentences) with beam 1 and beam 5, in batches of up to 128 equal-length sentences.

Three ways to time a configuration (backend, decoder, dtype) at a beam:

* ``estimate`` (the default): the full set's batches are built exactly as the full run builds
  them, a sample of them is timed at their real shapes, and the full set's time is estimated
  from it (:mod:`convs2s_bench.estimate`): minutes of work in seconds;
* ``full`` (``--full``): every batch is run;
* ``subset`` (``--sentences N``): the first N sentences of a fixed shuffled order, run whole.

Every configuration is warmed up at each beam before any timing, timed ``repeats`` times with the
configurations interleaved, and reported as the median with the range. The dispatcher counts,
per op, which backend ran each call during the timed runs; a row whose backend fell back to
another for some op is marked (``cpp*``).
"""

from __future__ import annotations

import copy
import json
import time
from collections import Counter
from dataclasses import dataclass, replace
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch

from convs2s.atomic import atomic_write_text
from convs2s.generate import STEPS_PER_GRAPH, Observer, warmup
from convs2s.errors import Convs2sError

from .estimate import (Batch, BatchTiming, TRUNCATED_LENGTH, estimate, full_set_batches, sample_batches,
                       summarise)
from .flops import generation_flops
from .roofline import RooflineError, fractions_of_peak, sync
from .workload import (DECODERS, DTYPES, LENGTH_NOTE, PAPER_ROWS, PAPER_SENTENCES, PEAK_OF,
                       REFERENCE, SUBSET_SEED, Config, auto_config, forced_lengths, hashed_ids, random_sentences,
                       subset_order, synthetic_lengths)


class SpeedTableError(Convs2sError):
    """Bad options for the speed table (unknown backend, dtype, missing file...)."""


# --- timing one batch ----------------------------------------------------------------------------
@dataclass
class Workload:
    sources: List[List[int]]          # token ids, EOS excluded
    forced: Optional[List[int]]       # forced output lengths (random weights), None with a checkpoint
    batch_size: int
    cuda_graph: bool = True           # decoding steps as CUDA graphs on CUDA (generate's default)
    steps_per_graph: int = STEPS_PER_GRAPH  # steps one graph holds

    def __post_init__(self):
        # the batches the full run makes (generate's own batching), once
        self.batches: List[Batch] = full_set_batches([len(s) for s in self.sources],
                                                     self.forced or [0] * len(self.sources), self.batch_size)

    def inputs(self, batch: Batch):
        """``(sources, forced lengths or None)`` of one batch."""
        forced = None if self.forced is None else [self.forced[i] for i in batch.indices]
        return [self.sources[i] for i in batch.indices], forced


def time_batch(model, work: Workload, batch: Batch, beam: int, config: Config, *, cut: Optional[int] = None,
               per_step: bool = True):
    """Run one batch, timing its preparation and each step; ``cut`` forces at most that many
    output tokens (the estimate's short runs), with the real shapes otherwise. ``per_step=False``
    times the steps as one part: on a GPU a wait per step would keep the host from queueing
    ahead of the device, which decoding itself never does (the CPU waits for nothing either way).
    Returns ``(BatchTiming, hypotheses)``."""
    from convs2s.generate import generate

    sources, forced = work.inputs(batch)
    device = next(model.parameters()).device
    marks: List[float] = []
    hook = (lambda step: (sync(device), marks.append(time.perf_counter())) if per_step or step < 0 else None)
    run_forced = None if forced is None else [min(f, cut) if cut else f for f in forced]
    sync(device)
    t0 = time.perf_counter()
    # a step timed alone must be a graph of its own (with several a replay, their hooks come together)
    hooks = Observer(forced_length=run_forced, on_step=hook, cuda_graph=None if work.cuda_graph else False,
                     steps_per_graph=1 if per_step else work.steps_per_graph)
    hyps = generate(model, sources, beam=beam, batch_size=len(sources), max_len_a=1.2 if forced else 0.0,
                    max_len_b=10 if forced else 200, fold_attention=config.decoder == "folded", observer=hooks)
    sync(device)
    if per_step:
        marks[-1] = time.perf_counter()  # the last step owns the bookkeeping after it: parts sum to the call
    else:
        marks.append(time.perf_counter())  # every step in one part
    times = [t0] + marks
    return BatchTiming(batch, times[1] - times[0], [b - a for a, b in zip(times[1:], times[2:])]), hyps


# --- the models, one per dtype ----------------------------------------------------------------------
class Models:
    """The model in each dtype the configurations need (int8: a float32 copy decoding with int8
    decoder weights), made once, so switching configurations between timings costs nothing."""

    def __init__(self, base: torch.nn.Module, device: torch.device):
        self.base, self.device, self.cache = base, device, {}

    def get(self, config: Config):
        if config.dtype not in self.cache:
            from convs2s.compute_type import apply_variant

            model = self.base if config.dtype == "fp32" else copy.deepcopy(self.base)
            self.cache[config.dtype] = apply_variant(model.to(self.device), config.dtype)
        return self.cache[config.dtype].use_backend(config.backend)

    def reset(self) -> None:
        """Every model back to the default backend and float weights (the fp32 one is the caller's)."""
        from convs2s.engine import quantize_decoder_int8

        for model in self.cache.values():
            quantize_decoder_int8(model.use_backend(None), False)


# --- one configuration at one beam, one repeat ---------------------------------------------------------
def _time_estimate(model, work: Workload, sample, beam, config):
    timings = [time_batch(model, work, work.batches[j], beam, config, cut=TRUNCATED_LENGTH)[0] for j in sample]
    est = estimate(work.batches, timings)
    return est.seconds, dict(model_uncertainty_s=est.model_uncertainty,
                             sample=[dict(sentences=t.batch.size, src_len=t.batch.src_len, steps=t.batch.steps,
                                          prepare_s=t.prepare, step_s=t.steps, modelled_s=t.full_seconds())
                                     for t in timings]), None


def _time_all(model, work: Workload, beam, config, progress):
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(work.sources), unit="sent", desc=f"{config.name} beam {beam}", leave=False)
    per_batch, outputs = [], [None] * len(work.sources)
    for b in work.batches:
        t, hyps = time_batch(model, work, b, beam, config, per_step=False)
        per_batch.append(t.prepare + sum(t.steps))
        for i, h in zip(b.indices, hyps):
            outputs[i] = h[0]["tokens"]
        if bar is not None:
            bar.update(b.size)
    if bar is not None:
        bar.close()
    return sum(per_batch), dict(batch_seconds=per_batch, batches=[[b.size, b.src_len] for b in work.batches]), outputs


def _warm_up(models: Models, work: Workload, batches, configs, beams) -> None:
    """Every (configuration, beam): one short decoding per autotune bucket of the source lengths
    to be timed (``convs2s.warmup``: on a GPU every Triton kernel tuned and compiled), then
    the largest and the smallest of the batches, cut short: first calls allocate, pack weights,
    pick kernels and tune, and none of that belongs in a timing."""
    ends = [max(range(len(batches)), key=lambda i: (batches[i].size, batches[i].src_len)),
            min(range(len(batches)), key=lambda i: (batches[i].size, batches[i].src_len))]
    longest = max(b.src_len for b in batches) + 1  # EOS included
    for config in configs:
        model = models.get(config)
        for beam in beams:
            warmup(model, max_source_length=min(longest, min(model.max_positions())), beam=beam,
                   fold_attention=config.decoder == "folded",
                   observer=Observer(cuda_graph=None if work.cuda_graph else False,
                                     steps_per_graph=work.steps_per_graph))
            for j in ends:
                time_batch(model, work, batches[j], beam, config, cut=1)


# --- the whole table ------------------------------------------------------------------------------------
@dataclass
class Plan:
    mode: str                  # "estimate", "full" or "subset"
    configs: List[Config]
    beams: List[int]
    repeats: int
    sample: Optional[List[int]] = None  # estimate: indices of the timed batches in the workload's


def measure(models: Models, work: Workload, plan: Plan, progress: bool = False,
            on_row: Optional[Callable[[dict], None]] = None, log=print) -> List[dict]:
    """Time every (configuration, beam) ``plan.repeats`` times, configurations interleaved within
    each repeat; returns one raw record per (configuration, beam) with every repeat's seconds,
    the method's details and the dispatch counts of the timed calls."""
    import convs2s_kernels as ck

    sample = plan.sample
    _warm_up(models, work, work.batches if sample is None else [work.batches[i] for i in sample], plan.configs,
             plan.beams)
    records = {(c, b): dict(config=c, beam=b, seconds=[], per_repeat=[], dispatches=Counter(), outputs=None)
               for c in plan.configs for b in plan.beams}
    for rep in range(plan.repeats):
        for config in plan.configs:
            model = models.get(config)
            for beam in plan.beams:
                rec = records[(config, beam)]
                with ck.count_dispatches() as counts:
                    if plan.mode == "estimate":
                        secs, details, outputs = _time_estimate(model, work, sample, beam, config)
                    else:
                        secs, details, outputs = _time_all(model, work, beam, config, progress)
                rec["seconds"].append(secs)
                rec["per_repeat"].append(details)
                rec["outputs"] = outputs
                rec["dispatches"] = counts  # the calls of one repeat
                log(f"repeat {rep + 1}/{plan.repeats} {config.name:<22} beam {beam}: {secs:.2f} s")
                if on_row is not None:
                    on_row(rec)
    return list(records.values())


def check_backends(names: Sequence[str], device: torch.device) -> List[str]:
    """The requested backends that exist; an unknown or unavailable one is an error with its reason."""
    import convs2s_kernels as ck

    avail = ck.available_backends()
    for name in names:
        if name not in avail:
            raise SpeedTableError(f"unknown backend {name!r}; known: {', '.join(avail)}")
        if avail[name] is not None:
            raise SpeedTableError(f"backend {name!r} is not available here: {avail[name]}")
        if name == "cpp" and device.type != "cpu":
            raise SpeedTableError("backend 'cpp' runs on the CPU only; use --device cpu")
        if name == "triton" and device.type == "cpu":
            raise SpeedTableError("backend 'triton' times GPUs only (on the CPU it runs in its interpreter, "
                                  "a correctness tool); use --device cuda")
    return list(names)


def choose_configs(device: torch.device, backends: Optional[Sequence[str]], dtypes: Optional[Sequence[str]],
                   decoders: Optional[Sequence[str]]) -> List[Config]:
    """Every (backend, decoder, dtype) asked for; with none asked, the reference backend's plain
    fp32 decoder (the baseline) and the configuration ``auto`` chooses (dtype ``auto``, measured
    on the model by :func:`resolve_auto` once it is loaded)."""
    import convs2s_kernels as ck

    for name, given, known in (("dtype", dtypes, (*DTYPES, "auto")), ("decoder", decoders, DECODERS)):
        bad = [d for d in given or () if d not in known]
        if bad:
            raise SpeedTableError(f"unknown {name} {bad[0]!r}; choose from {', '.join(known)}")
    auto = auto_config(device, ck.available_backends())
    if not (backends or dtypes or decoders):
        return [REFERENCE, auto]
    backends = check_backends(backends or ["reference", auto.backend], device)
    backends = sorted(dict.fromkeys(backends), key=lambda b: b != "reference")  # the baseline first
    dtypes = sorted(dict.fromkeys(dtypes or ["fp32"]), key=lambda d: d != "fp32")
    return [Config(b, d, t) for t in dtypes for b in backends for d in (decoders or ["plain"])]


def resolve_auto(configs: Sequence[Config], model, device: torch.device, beams: Sequence[int], *,
                 remeasure: bool = False, log=print, choose=None) -> Tuple[List[Config], Dict[str, dict]]:
    """Each configuration with dtype ``auto`` given the dtype :func:`convs2s.compute_type.choose_decoding`
    measures fastest for ``model`` on ``device`` under that backend and decoder (at the largest beam);
    returns the configurations (duplicates dropped) and, per resolved configuration's name, the choice."""
    from convs2s.compute_type import choose_decoding

    choose = choose or choose_decoding
    out: List[Config] = []
    chosen: Dict[str, dict] = {}
    for c in configs:
        if c.dtype == "auto":
            was = model.backend
            model.to(device).use_backend(c.backend)
            try:
                choice = choose(model, "auto", beam=max(beams), fold_attention=c.decoder == "folded",
                                remeasure=remeasure)
            finally:
                model.backend = was
            if choice.name not in DTYPES:  # e.g. CONVS2S_COMPUTE_TYPE naming an encoder variant
                raise SpeedTableError(f"auto chose {choice.name} ({choice.why}), which the speed table does not time; "
                                      f"it times {', '.join(DTYPES)}")
            c = replace(c, dtype=choice.name)
            chosen[c.name] = dict(choice=choice.name, why=choice.why, cached=choice.cached, seconds=choice.seconds)
            log(choice.line(f"auto ({c.backend} {c.decoder})"))
        if c not in out:
            out.append(c)
    return out, chosen


# --- what to time ---------------------------------------------------------------------------------------
@dataclass
class SpeedTableRequest:
    """What to time: the model (an architecture with random weights, or a checkpoint), the
    sentences, the method (``mode``: ``estimate``, ``full`` or ``subset``), the configurations
    and the beams."""

    arch: str = "fconv_wmt_en_fr"
    checkpoint: Optional[str] = None
    dicts: Optional[str] = None
    source: Optional[str] = None
    reference: Optional[str] = None
    spm: Optional[str] = None
    mode: str = "estimate"
    sentences: Optional[int] = None
    beams: Sequence[int] = (1, 5)
    backends: Optional[Sequence[str]] = None
    device: str = "cpu"
    dtypes: Optional[Sequence[str]] = None
    decoders: Optional[Sequence[str]] = None
    repeats: int = 3
    batch_size: int = 128
    vocab: int = 40000
    seed: int = 1
    cuda_graph: bool = True
    steps_per_graph: int = STEPS_PER_GRAPH
    remeasure: bool = False  # measure the auto dtype again instead of reading it from the cache

    def configs(self) -> Tuple[torch.device, List[Config]]:
        """The device and the configurations to time; options that do not fit together are an error."""
        try:
            dev = torch.device(self.device)
        except RuntimeError:
            raise SpeedTableError(f"unknown --device {self.device!r}; use cpu or cuda") from None
        if dev.type == "cuda" and not torch.cuda.is_available():
            raise SpeedTableError("--device cuda asked for, but torch sees no CUDA device")
        if self.mode not in ("estimate", "full", "subset"):
            raise SpeedTableError(f"unknown mode {self.mode!r}")
        if (self.mode == "subset") != (self.sentences is not None):
            raise SpeedTableError("give the number of sentences with the subset mode, and only with it")
        if self.repeats < 1:
            raise SpeedTableError(f"repeats must be at least 1, got {self.repeats}")
        configs = choose_configs(dev, self.backends, self.dtypes, self.decoders)
        if self.reference and not self.checkpoint:
            raise SpeedTableError("--reference needs --checkpoint: BLEU of random weights means nothing")
        if self.checkpoint and self.mode == "estimate":
            raise SpeedTableError("the estimate needs forced output lengths (random weights); with --checkpoint "
                                  "use --full or --sentences N")
        return dev, configs

    def load_model(self) -> tuple:
        """``(model, src_dict, tgt_dict, architecture name)``: the checkpoint's, or random weights
        (dictionaries None); weight norm folded, in eval mode."""
        import convs2s

        src_dict = tgt_dict = None
        if self.checkpoint:
            model, src_dict, tgt_dict = convs2s.load_fairseq(self.checkpoint, self.dicts)
            arch_name = model.cfg.arch
        else:
            torch.manual_seed(self.seed)
            model = convs2s.build_model(self.arch, self.vocab, self.vocab)  # ValueError names the known architectures
            arch_name = self.arch
        return model.fold_weight_norm().eval(), src_dict, tgt_dict, arch_name


def make_workload(request: SpeedTableRequest, model, src_dict, tokenizer, log) -> tuple:
    """The sentences to translate (ids), their order in the input and the set's total size."""
    from convs2s.translate import read_lines

    source, sentences, vocab = request.source, request.sentences, request.vocab
    texts: Optional[List[str]] = None
    if source:
        texts = [t for _, t in read_lines(source)]
        if not texts:
            raise SpeedTableError(f"{source} holds no sentences")
        order = subset_order(len(texts)) if sentences is not None else list(range(len(texts)))
    else:
        lengths_all = synthetic_lengths()
        order = list(range(len(lengths_all)))  # already shuffled
    n_total = len(order)
    order = order[:sentences] if sentences is not None else order
    if texts is not None:
        toks = [tokenizer.encode(texts[i]) for i in order]
        ids = [src_dict.encode(t) for t in toks] if request.checkpoint else [hashed_ids(t, vocab) for t in toks]
    else:
        ids = random_sentences([lengths_all[i] for i in order], vocab, request.seed)
    max_src = min(model.max_positions()) - 1
    keep = [i for i, s in enumerate(ids) if 0 < len(s) <= max_src]
    if len(keep) < len(ids):
        log(f"skipping {len(ids) - len(keep)} empty or over-long sentences")
    ids, order = [ids[i] for i in keep], [order[i] for i in keep]
    work = Workload(ids, None if request.checkpoint else forced_lengths(ids), request.batch_size, request.cuda_graph,
                    request.steps_per_graph)
    return work, order, n_total


def _references(reference: Optional[str], order: List[int], n_total: int) -> Optional[List[str]]:
    if not reference:
        return None
    from convs2s.translate import read_lines

    lines = [t for _, t in read_lines(reference)]
    if len(lines) != n_total:
        raise SpeedTableError(f"{reference} has {len(lines)} lines but the source has {n_total}")
    return [lines[i] for i in order]


def measure_machine(device: torch.device, configs: Sequence[Config]) -> dict:
    """The machine's description with the peaks (GEMM per dtype timed, copy bandwidth) measured now."""
    from convs2s_kernels.env import machine_description

    from .roofline import measure_peaks

    kinds = {PEAK_OF[c.dtype] for c in configs}  # the peaks the rows are held against
    return dict(machine_description(device),
                **measure_peaks(device, sorted({DTYPES[c.dtype] for c in configs}, key=str),
                                int8="int8" in kinds, int7="int7" in kinds, w7a7="w7a7" in kinds))


def _setup(request: SpeedTableRequest, model, arch_name: str, work: Workload, n_total: int, sample) -> dict:
    """What was timed, as the header and the JSON report it."""
    checkpoint, sentences = request.checkpoint, request.sentences
    return dict(arch=arch_name, checkpoint=checkpoint, parameters=model.num_parameters(),
                source=request.source or LENGTH_NOTE, newstest=request.source is None, mode=request.mode,
                sentences=len(work.sources), of_sentences=n_total, batches=len(work.batches),
                batch_size=request.batch_size, repeats=request.repeats,
                sample_batches=None if sample is None else len(sample),
                subset=None if sentences is None else f"first {len(work.sources)} of a fixed shuffled order "
                                                      f"(seed {SUBSET_SEED})",
                forced_length=None if checkpoint else "round(1.1 x source length)",
                vocab=None if checkpoint else request.vocab, seed=request.seed,
                cuda_graph=request.cuda_graph and request.device.startswith("cuda"),
                # the estimate times steps one by one: one a graph
                steps_per_graph=(1 if request.mode == "estimate" else request.steps_per_graph)
                if request.cuda_graph and request.device.startswith("cuda") else None,
                measured=time.strftime("%Y-%m-%d", time.gmtime()))


def run(request: Optional[SpeedTableRequest] = None, *, progress: bool = False,
        on_update: Optional[Callable[[dict], None]] = None, log=print, **options) -> dict:
    """Time generation for every configuration and beam; returns ``{"rows", "machine", "setup"}``.

    What to time is a :class:`SpeedTableRequest`, or its fields as keywords (``options``; with a
    request, they replace its fields). ``mode`` is ``estimate`` (the full set's time from a timed
    sample of its batches), ``full`` (every sentence) or ``subset`` (the first ``sentences`` of a
    fixed shuffled order). ``on_update(partial_result)`` is called after every timing (to save progress).
    """
    from convs2s.translate import Tokenizer

    request = SpeedTableRequest(**options) if request is None else replace(request, **options)
    dev, configs = request.configs()
    tokenizer = Tokenizer(request.spm) if request.spm else Tokenizer()
    model, src_dict, tgt_dict, arch_name = request.load_model()
    work, order, n_total = make_workload(request, model, src_dict, tokenizer, log)
    refs = _references(request.reference, order, n_total)
    configs, auto = resolve_auto(configs, model, dev, request.beams, remeasure=request.remeasure, log=log)
    machine = measure_machine(dev, configs)
    sample = sample_batches(work.batches) if request.mode == "estimate" else None
    models = Models(model, dev)
    setup = dict(_setup(request, model, arch_name, work, n_total, sample), auto=auto)
    table = Table(work, models, machine, setup, Scorer(refs, tgt_dict, tokenizer))
    plan = Plan(request.mode, configs, list(request.beams), request.repeats, sample)
    records = measure(models, work, plan, progress=progress, on_row=table.progress(on_update), log=log)
    models.reset()
    return table.result(records)


# --- the rows -------------------------------------------------------------------------------------------
@dataclass
class Scorer:
    """BLEU of a row's outputs against the references (None without references)."""

    refs: Optional[List[str]]
    tgt_dict: object
    tokenizer: object

    def bleu(self, outputs) -> Optional[float]:
        if self.refs is None:
            return None
        import sacrebleu

        out = [self.tokenizer.decode([self.tgt_dict[int(t)] for t in toks[:-1]]) for toks in outputs]
        return sacrebleu.corpus_bleu(out, [self.refs]).score


def _dispatches(rec: dict) -> Tuple[Dict[str, Dict[str, int]], Dict[str, Dict[str, int]]]:
    """The calls of one repeat per op and backend, and those that ran on another backend than the row's."""
    dispatches: Dict[str, Dict[str, int]] = {}
    for (op, backend), n in sorted(rec["dispatches"].items()):
        dispatches.setdefault(op, {})[backend] = n
    fell_back = {op: {b: n for b, n in per.items() if b != rec["config"].backend} for op, per in dispatches.items()}
    return dispatches, {op: per for op, per in fell_back.items() if per}


class Table:
    """The table's rows from the raw records, with what every row shares: the workload, the models,
    the machine (its peaks), the setup and the BLEU scorer."""

    def __init__(self, work: Workload, models: Models, machine: dict, setup: dict, scorer: Scorer):
        self.work, self.models, self.machine, self.setup, self.scorer = work, models, machine, setup, scorer

    def result(self, records) -> dict:
        rows = [self.row(rec) for rec in records if rec["seconds"]]
        return dict(rows=rows, machine=self.machine, setup=self.setup)

    def progress(self, on_update: Optional[Callable[[dict], None]]) -> Callable[[dict], None]:
        """An ``on_row`` for :func:`measure`: hands ``on_update`` the partial result after every timing."""
        live: Dict = {}

        def on_row(rec):
            live[(rec["config"], rec["beam"])] = rec
            if on_update is not None:
                on_update(dict(self.result(list(live.values())), partial=True))

        return on_row

    def row(self, rec: dict) -> dict:
        """One table row from the raw record of a (configuration, beam)."""
        work, config, beam, secs = self.work, rec["config"], rec["beam"], rec["seconds"]
        spread = summarise(secs)
        if work.forced is not None:
            tgt_lengths = [f + 1 for f in work.forced]  # EOS included, as fairseq counts
        else:
            tgt_lengths = [len(t) for t in rec["outputs"]]
        dispatches, fell_back = _dispatches(rec)
        sources = [len(s) for s in work.sources]
        flops = generation_flops(self.models.base, sources, tgt_lengths, beam)
        median = spread["median"]
        # the fraction of peak from the work this configuration does (the folded decoder does less
        # than the plain one, whose work the GFLOP/s column counts for every row)
        folded = config.decoder == "folded"
        done = generation_flops(self.models.base, sources, tgt_lengths, beam, folded=True) if folded else flops
        try:  # no peak for the dtype (int8 on a GPU): no fraction; above the peak: kept as the row's error
            fraction = fractions_of_peak(gflops_per_s=done / median / 1e9, gb_per_s=0.0,
                                         gemm_gflops=self.machine.get(f"gemm_gflops_{PEAK_OF[config.dtype]}")
                                         ).get("fraction_of_gemm_peak")
            accounting_error = None
        except RooflineError as exc:  # the table is still printed and saved, then the command fails
            fraction, accounting_error = None, str(exc)
        uncertainty = [d["model_uncertainty_s"] for d in rec["per_repeat"] if "model_uncertainty_s" in d]
        return dict(
            backend=config.backend, decoder=config.decoder, dtype=config.dtype, beam=beam,
            auto=config.name in self.setup.get("auto", {}),
            label=config.backend + ("*" if fell_back else ""), method=("estimate" if uncertainty else "measured"),
            sentences=len(work.sources), source_tokens=sum(len(s) for s in work.sources),
            target_tokens=sum(tgt_lengths), seconds=median, seconds_min=spread["min"], seconds_max=spread["max"],
            repeats=spread["repeats"], seconds_per_repeat=secs,
            model_uncertainty_s=max(uncertainty) if uncertainty else None,
            sentences_per_s=len(work.sources) / median, tokens_per_s=sum(tgt_lengths) / median,
            gflops_per_s=flops / median / 1e9,
            fraction_of_gemm_peak=fraction, accounting_error=accounting_error,
            bleu=self.scorer.bleu(rec["outputs"]), dispatches=dispatches, fell_back=fell_back,
            per_repeat=rec["per_repeat"])


def write_json(result: dict, path: str) -> None:
    atomic_write_text(path, json.dumps(result, indent=1))


def _header(result: dict) -> List[str]:
    setup, machine = result["setup"], result["machine"]
    how = {
        "estimate": f"the full set's {setup['batches']} batches (up to {setup['batch_size']} equal-length sentences "
                    f"each, as the full run makes them), its time estimated from {setup['sample_batches']} of "
                    f"them timed at their real shapes for their first {TRUNCATED_LENGTH} steps and EOS, priced per "
                    "batch by a cost model in rows x steps (bench/convs2s_bench/estimate.py)",
        "full": f"every one of the {setup['batches']} batches run (up to {setup['batch_size']} equal-length sentences)",
        "subset": f"{setup['subset']}, batched by equal length; not an estimate of the full set",
    }[setup["mode"]]
    isa = ", ".join(machine.get("isa") or ["unknown ISA"])
    caps = ", ".join(f"{k}={v}" for k, v in (machine.get("isa_caps") or {}).items())
    return [
        f"Generation speed, {setup['arch']} ({setup['parameters']:,} parameters): {setup['sentences']:,} of "
        f"{setup['of_sentences']:,} sentences of {setup['source']}.",
        f"Timing: {how}. Each row is the median of {setup['repeats']} repeat(s), configurations interleaved and "
        "each warmed up at each beam first; the range over repeats follows"
        + ("; ± is the estimate's model uncertainty (largest change when one sample batch is left out)."
           if setup["mode"] == "estimate" else "."),
        f"Machine: {machine['cpu']}; {isa}" + (f" (capped: {caps})" if caps else "")
        + f"; {machine['threads']} threads; {machine.get('allocator', 'unknown')}; torch {machine['torch']}"
        + "".join(f", {k} {machine[k]}" for k in ("mkl", "onednn") if machine.get(k))
        + ("; bf16 native (" + machine["native_bf16"] + ")" if machine.get("native_bf16") else "; bf16 not native")
        + (f"; {machine['gpu']}" if machine.get("gpu") else "")
        + ({True: f"; decoding steps replayed as CUDA graphs, {setup.get('steps_per_graph') or 1} a graph",
            False: "; decoding steps eager (--no-cuda-graph)"}
           .get(setup.get("cuda_graph")) if machine.get("gpu") else "") + ".",
        "Peaks measured in this run: GEMM " + ", ".join(
            f"{k[len('gemm_gflops_'):]} {v:.0f} GFLOP/s" for k, v in machine.items() if k.startswith("gemm_gflops_"))
        + (f"; copy {machine['copy_gbps']:.1f} GB/s" if "copy_gbps" in machine else "")
        + ". GFLOP/s count the plain decoder's work for every row (% of GEMM peak: the work the row's decoder does); speedups are over the reference backend's "
          "plain decoder in the same dtype, and in fp32 (int8: int8 decoder weights and activations; "
          "int8w: int8 decoder weights, fp32 activations; int7: int8 decoder weights, 7-bit activations; "
          "w7a7: 7-bit decoder weights and activations).",
    ]


def _percent_of_peak(row: dict) -> str:
    if row.get("accounting_error"):
        return "! above peak"
    fraction = row.get("fraction_of_gemm_peak")
    return "-" if fraction is None else f"{100 * fraction:.0f}%"


def _row_name(row: dict) -> str:
    return f"{row['backend']} {row['decoder']} {row['dtype']} beam {row['beam']}"


def auto_losses(result: dict) -> List[str]:
    """The rows ``auto`` chose that lost to the fp32 reference at their beam by more than their own
    spread over repeats (max - min): the choice was wrong for this workload."""
    ref = {r["beam"]: r for r in result["rows"] if r["backend"] == "reference" and r["decoder"] == "plain"
           and r["dtype"] == "fp32"}
    lost = []
    for r in result["rows"]:
        base = ref.get(r["beam"])
        if r.get("auto") and base and r["seconds"] - base["seconds"] > r["seconds_max"] - r["seconds_min"]:
            lost.append(f"{_row_name(r)} ({r['seconds']:,.1f} s against the reference's {base['seconds']:,.1f} s, "
                        f"spread {r['seconds_max'] - r['seconds_min']:,.1f} s)")
    return lost


def accounting_errors(result: dict) -> List[str]:
    """The rows whose rate came out above the machine's measured peak (a miscount, never a result)."""
    return [_row_name(r) for r in result["rows"] if r.get("accounting_error")]


def format_table(result: dict) -> str:
    """Markdown: the header, this machine's rows, what fell back, the paper's rows beside them."""
    rows, setup = result["rows"], result["setup"]
    base = {(r["dtype"], r["beam"]): r["seconds"] for r in rows
            if r["backend"] == "reference" and r["decoder"] == "plain"}
    what = "these sentences" if setup["mode"] == "subset" else f"all {setup['sentences']:,} sentences"
    lines = _header(result) + [
        "", f"| backend | decoder | dtype | beam | BLEU | time for {what} (s) | range (s) | ± model (s) | sent/s "
            "| tok/s | GFLOP/s | % of GEMM peak | vs reference | vs fp32 reference |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        ref, ref32 = base.get((r["dtype"], r["beam"])), base.get(("fp32", r["beam"]))
        speedup = [f"{b / r['seconds']:.2f}x" if b else "n/a" for b in (ref, ref32)]
        bleu = "-" if r["bleu"] is None else f"{r['bleu']:.2f}"
        model_pm = "-" if r["model_uncertainty_s"] is None else f"{r['model_uncertainty_s']:,.1f}"
        lines.append(
            f"| {r['label']} | {r['decoder']} | {r['dtype']}{' (auto)' if r.get('auto') else ''} | {r['beam']} | {bleu} | {r['seconds']:,.1f} | "
            f"{r['seconds_min']:,.1f}–{r['seconds_max']:,.1f} | {model_pm} | {r['sentences_per_s']:.2f} | "
            f"{r['tokens_per_s']:.1f} | {r['gflops_per_s']:.1f} | {_percent_of_peak(r)} | "
            f"{speedup[0]} | {speedup[1]} |")
    for name, c in (setup.get("auto") or {}).items():
        lines += ["", f"(auto) {name}: chosen among fp32 and bf16 for this model on this machine "
                      f"({c['why']}{'; cached' if c.get('cached') else ''})."]
    wrong = [r for r in rows if r.get("accounting_error")]
    if wrong:
        lines.append("")
    for r in wrong:
        lines.append(f"! {_row_name(r)}: {r['accounting_error']}.")
    starred = [r for r in rows if r["fell_back"]]
    if starred:
        lines.append("")
    for r in starred:
        ran = "; ".join(f"{op}: " + ", ".join(f"{b} {n:,}" for b, n in per.items())
                        for op, per in r["dispatches"].items() if op in r["fell_back"])
        lines.append(f"\\* {_row_name(r)}: some calls ran on another "
                     f"backend (calls per op in one repeat): {ran}.")
    lines += ["", "The paper's Table 3 (newstest2012+2013, 6003 sentences, trained model)"
              + ("" if setup.get("newstest") else f"; not the set timed above ({setup['source']})") + ":", "",
              "| system | BLEU | time (s) | sent/s |", "|---|---|---|---|"]
    for name, bleu, secs, _ in PAPER_ROWS:
        lines.append(f"| {name} | {bleu:.2f} | {secs:,} | {PAPER_SENTENCES / secs:.1f} |")
    return "\n".join(lines)
