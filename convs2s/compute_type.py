"""Which number format decodes and trains fastest on this machine, measured, not read from flags.

A compute type (CTranslate2's word) is how a model computes while decoding: ``fp32``, ``bf16``
(weights and activations in bfloat16), or an int8 variant (:data:`INT8_VARIANTS`: int8 weights,
int8 or 7-bit activations, the encoder quantised too or not; the table is the engine's,
:mod:`convs2s.engine.variants`). ``auto`` takes the faster of fp32 and bf16, timed on the model
at hand; ``int8`` the fastest int8 variant, timed likewise (int8 changes the numbers, so ``auto``
never takes it). Training's ``--precision auto`` takes bf16 autocast only where a conv+GLU
layer's forward and backward at the batch's shape ran faster in it than in fp32.

A CPU flag never decides alone: AVX512-BF16 without AMX ran bf16 products at half the fp32 rate
(issue 48), and bf16 weights widened in registers can win a memory-bound step where the flags
say bf16 is emulated. Each answer is measured once per machine and model shape and kept beside
the kernel choice (:mod:`convs2s_kernels.tune_cache`, the same machine key: CPU, ISA caps,
threads, torch version, extension build); ``--remeasure`` or ``remeasure=True`` measures again.
``CONVS2S_COMPUTE_TYPE`` (decoding) and ``CONVS2S_PRECISION`` (training) override ``auto``;
with measuring off (``CONVS2S_TUNE=0``) and nothing cached, ``auto`` is fp32.
"""

from __future__ import annotations

import copy
import hashlib
import os
import statistics
import time
import warnings
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch

from convs2s_kernels import tune, tune_cache

from .engine import prepare
from .engine.variants import FLOAT_VARIANTS, INT8_VARIANTS, VARIANTS, Variant  # noqa: F401  (part of this module's API)
from .errors import Convs2sError
from .generate import Observer, generate

COMPUTE_TYPES = ("auto", "fp32", "bf16", "int8")
DECODE_ENV = "CONVS2S_COMPUTE_TYPE"
TRAIN_ENV = "CONVS2S_PRECISION"
CACHE_PREFIX = "compute-type"
OFF = ("nothing cached, and measuring is off here (CONVS2S_TUNE=0, or several processes: run once with one "
       "process to measure)")




def apply_variant(model, variant) -> "torch.nn.Module":
    """Make ``model`` (in place: its dtype, its preparation's quantisation) compute as ``variant``
    (a name or :class:`Variant`); returns it."""
    prepare(model, VARIANTS[variant] if isinstance(variant, str) else variant)
    return model


def candidates_for(compute_type: str) -> List[str]:
    """The variant names a requested compute type chooses among (one name: no choice)."""
    if compute_type == "auto":
        return list(FLOAT_VARIANTS)
    if compute_type == "int8":
        return list(INT8_VARIANTS)
    if compute_type in VARIANTS:
        return [compute_type]
    raise Convs2sError(f"unknown compute type {compute_type!r}; choose from {', '.join(COMPUTE_TYPES)} "
                       f"(or an int8 variant: {', '.join(INT8_VARIANTS)})")


def ruled_out(name: str, device: torch.device) -> Optional[str]:
    """Why a candidate cannot run here at all (a flag may rule one out, never pick one), or None."""
    v = VARIANTS[name]
    if device.type == "cuda" and v.int8:
        return "int8 decoding runs on the CPU kernels only"
    if device.type == "cuda" and v.dtype == torch.bfloat16 and not torch.cuda.is_bf16_supported():
        return "this GPU has no bf16"
    return None


@dataclass
class Choice:
    """What was chosen among ``seconds`` (name -> the measured times, one per timed shape)."""

    name: str
    seconds: Dict[str, List[float]]
    why: str
    cached: bool = False

    def line(self, what: str) -> str:
        return f"{what}: {self.name} ({self.why}{'; cached' if self.cached else ''})"


# --- the cache ------------------------------------------------------------------------------------------
def _cache_path():
    """This machine's compute-type file beside the kernel choice's, under the same machine key."""
    key = dict(tune_cache.machine_key(), kind=CACHE_PREFIX)
    return tune_cache.cache_path(key, kind=CACHE_PREFIX), key


def load_cached(entry: str) -> Optional[dict]:
    """The cached measurement named ``entry`` for this machine, or None (missing, or malformed)."""
    e = tune_cache.entries_at(*_cache_path()).get(entry)
    well_formed = isinstance(e, dict) and isinstance(e.get("choice"), str) and isinstance(e.get("seconds"), dict) \
        and isinstance(e.get("why"), str)
    return e if well_formed else None


def save_cached(entry: str, value: dict) -> None:
    """Merge one entry into this machine's file, atomically and under a lock (two processes keep both)."""
    path, key = _cache_path()
    try:
        tune_cache.save_merged(path, key, {entry: value}, lambda: tune_cache.entries_at(path, key))
    except OSError as exc:  # a read-only or full cache: the answer still holds for this process
        warnings.warn(f"could not save the compute-type choice to {path} ({exc}); it will be measured again next time")


# --- timing ---------------------------------------------------------------------------------------------
SCREEN = 2.0  # after the first round, a candidate this many times slower than the fastest is not timed again


def time_interleaved(fns: Dict[str, Callable[[], object]], rounds: int = 3, screen: float = SCREEN,
                     clock: Callable[[], float] = time.perf_counter) -> Dict[str, float]:
    """Each function's median over ``rounds``, the functions run in turn within each round (drift
    hits every candidate alike); each is called once first, untimed (warm-up, kernel choice). A
    candidate ``screen`` times slower than the fastest in the first round keeps that one time: a
    far slower one (bf16 emulated in software) costs one round, not all of them."""
    for fn in fns.values():
        fn()
    times: Dict[str, List[float]] = {name: [] for name in fns}
    live = list(fns)
    for r in range(rounds):
        order = live if r % 2 == 0 else list(reversed(live))  # neither always goes first
        for name in order:
            t0 = clock()
            fns[name]()
            times[name].append(clock() - t0)
        if r == 0:
            best = min(times[n][0] for n in live)
            live = [n for n in live if times[n][0] <= screen * best]
    return {name: statistics.median(t) for name, t in times.items()}


MARGIN = 0.03  # a candidate leaves the first (fp32, the exact one) only when at least 3% faster: not for noise


def pick(seconds: Dict[str, List[float]], order: Sequence[str], margin: float = MARGIN) -> Tuple[str, str]:
    """The candidate with the smallest geometric mean of its times relative to the first
    candidate's (each shape counts alike, whatever its absolute time), the first unless another
    beats it by ``margin``; ties go to the earlier in ``order``. Returns (name, why: the times)."""
    base = seconds[order[0]]

    def score(name: str) -> float:
        ratios = [t / b for t, b in zip(seconds[name], base)]
        return statistics.geometric_mean(ratios) if all(r > 0 for r in ratios) else float("inf")

    best = min(order, key=lambda n: (score(n), order.index(n)))
    if score(best) > 1 - margin:
        best = order[0]
    shown = ", ".join(f"{n} " + "/".join(f"{t * 1e3:.1f}" for t in seconds[n]) + " ms" for n in order)
    return best, f"measured {shown}"


# --- decoding -------------------------------------------------------------------------------------------
def model_signature(model) -> str:
    """What the timing depends on in a model: its parameters' names and shapes, hashed."""
    shapes = [(k, tuple(v.shape)) for k, v in model.state_dict().items()]
    return hashlib.sha1(repr(shapes).encode()).hexdigest()[:12]


def _decode_workload(model, beam: int) -> List[Tuple[List[List[int]], int]]:
    """A few-row step (one sentence, ``beam`` rows) and a many-row one (16 sentences), sources of
    the newstest mean length (25 subwords) or the model's limit, each decoded for 6 steps."""
    S = max(1, min(25, min(model.max_positions()) - 2))
    word = min(4, model.src_vocab_size - 1)
    return [([[word] * S], 6), ([[word] * S] * 16, 6)]


def _copy_for(model, variant: Variant):
    """A copy of ``model`` to time ``variant`` on: its own parameters where the variant changes
    their dtype, else the caller's float32 parameters shared (an int8 variant only derives its own
    weights from them), so timing seven int8 variants holds one float model, not seven."""
    if variant.dtype == next(model.parameters()).dtype:
        return copy.deepcopy(model, memo={id(p): p for p in model.parameters()})
    return copy.deepcopy(model)


FAR = 4.0  # a candidate this many times behind the best on a shape is not run on the larger ones


def screen(run: Callable[[str, int, Optional[float]], object], names: Sequence[str], shapes: int,
           clock: Callable[[], float] = time.perf_counter) -> Dict[str, List[float]]:
    """One untimed and one timed ``run(name, shape, deadline)`` per candidate and shape, shapes in
    order (the cheapest first). A candidate after the first on a shape runs with a deadline,
    ``FAR`` times the best time so far after each run's start (``run`` stops there, and its time is
    then at least that: bf16 emulated in software costs FAR times fp32's time, not its own
    (bench/results/kernel-decisions.md#compute-type-screen-deadline)); one ``FAR`` times behind keeps the times it has and is not
    run on the later shapes, and once one candidate is left, nothing more is run (there is
    nothing to choose)."""
    times: Dict[str, List[float]] = {n: [] for n in names}
    live = list(names)
    for shape in range(shapes):
        if len(live) == 1 and shape:
            break
        best = None
        for n in live:
            limit = None if best is None else FAR * best
            run(n, shape, None if limit is None else clock() + limit)
            t0 = clock()
            run(n, shape, None if limit is None else t0 + limit)
            times[n].append(clock() - t0)
            best = times[n][shape] if best is None else min(best, times[n][shape])
        live = [n for n in live if times[n][shape] <= FAR * best]
    return times


class _PastDeadline(Exception):
    """A screened decoding past its deadline (:func:`screen`): stopped at the next step."""


def measure_decoding(model, names: Sequence[str], *, beam: int = 5, fold_attention: bool = True,
                     rounds: int = 3) -> Dict[str, List[float]]:
    """Each variant's time (seconds) to decode the few-row and the many-row workload with
    ``model`` (copied per variant, the caller's untouched). First a :func:`screen` at the default
    kernel choice, measuring none (a candidate far behind at the few-row shape is stopped there
    and not run at the many-row one); the candidates screened on every shape and within
    ``SCREEN`` of the best are then timed interleaved, each measuring its kernel choice first.
    The others keep their screen times; a lone survivor is not timed again (there is nothing to
    choose) and keeps the few-row time alone."""
    work = _decode_workload(model, beam)
    models = {n: apply_variant(_copy_for(model, VARIANTS[n]), n) for n in names}

    def run(name: str, shape: int, deadline: Optional[float] = None) -> None:
        sources, steps = work[shape]
        first = (name, shape) not in ran
        ran.add((name, shape))
        if first and deadline is not None:
            # a warm-up under a deadline pays the one-off costs (the variant's weights, the step's code) on
            # one word and one step: a deadline cannot stop an encoding, and a timing it leaves colder is
            # only screened by, never chosen by (bench/results/kernel-decisions.md#compute-type-screen-deadline)
            sources, steps = [sources[0][:1]], 1

        def on_step(step: int) -> None:  # a warm-up always does its first step: its one-off costs are its purpose
            if deadline is not None and (step >= 0 or not first) and time.perf_counter() > deadline:
                raise _PastDeadline

        try:
            generate(models[name], sources, beam=beam, batch_size=len(sources), max_len_b=steps + 2,
                     fold_attention=fold_attention,
                     observer=Observer(forced_length=[steps] * len(sources), on_step=on_step))
        except _PastDeadline:
            pass

    ran: set = set()
    with torch.no_grad():  # as generate runs
        with tune.measuring(False):
            out = screen(run, names, len(work))
        screened = max(len(t) for t in out.values())
        complete = [n for n in names if len(out[n]) == screened]
        best = [min(out[n][i] for n in complete) for i in range(screened)]
        live = [n for n in complete if statistics.geometric_mean([t / b for t, b in zip(out[n], best)]) <= SCREEN]
        if len(live) > 1:
            for shape in range(screened):
                medians = time_interleaved({n: (lambda n=n, shape=shape: run(n, shape)) for n in live}, rounds)
                for n in live:
                    out[n][shape] = medians[n]
    return {n: out[n] for n in names}


def _device_name(device: torch.device) -> str:
    """The device in a cache entry: the CPU is the machine key's; a GPU is named (two GPUs behind
    one CPU model do not share an answer)."""
    if device.type != "cuda":
        return device.type
    return f"cuda:{torch.cuda.get_device_name(device)}:{torch.version.cuda}"


def _measuring_allowed() -> bool:
    return tune.tuning_enabled()


def choose_decoding(model, compute_type: str = "auto", *, beam: int = 5, fold_attention: bool = True,
                    remeasure: bool = False,
                    measure: Optional[Callable[..., Dict[str, List[float]]]] = None) -> Choice:
    """The variant ``compute_type`` stands for with this model on its device: measured among the
    candidates (``auto``: fp32, bf16; ``int8``: the int8 variants) or read from the cache;
    ``CONVS2S_COMPUTE_TYPE`` overrides ``auto``. ``measure`` replaces the timing (tests)."""
    env = os.environ.get(DECODE_ENV)
    device = next(model.parameters()).device
    if compute_type == "auto" and env and env != "auto":
        if env == "int8":  # the fastest int8 variant, as --compute-type int8
            choice = choose_decoding(model, "int8", beam=beam, fold_attention=fold_attention, remeasure=remeasure,
                                     measure=measure)
            return Choice(choice.name, choice.seconds, f"{DECODE_ENV}=int8, {choice.why}", choice.cached)
        candidates_for(env)  # an unknown value is an error, named
        if ruled_out(env, device):
            raise Convs2sError(f"{DECODE_ENV}={env} cannot run here: {ruled_out(env, device)}")
        return Choice(env, {}, f"{DECODE_ENV}={env}")
    names = candidates_for(compute_type)
    names = [n for n in names if ruled_out(n, device) is None]
    if not names:
        raise Convs2sError(f"compute type {compute_type!r} cannot run on {device.type}: "
                           f"{ruled_out(candidates_for(compute_type)[0], device)}")
    if len(names) == 1:
        return Choice(names[0], {}, "the only candidate here" if compute_type in ("auto", "int8") else "asked for")
    entry = f"decode:{_device_name(device)}:{model.backend or 'auto'}:{model_signature(model)}:beam{beam}:" \
            f"{'folded' if fold_attention else 'plain'}:" + ",".join(names)
    cached = None if remeasure else load_cached(entry)
    if cached is not None and cached["choice"] in names:
        return Choice(cached["choice"], cached["seconds"], cached["why"], cached=True)
    if measure is None and not _measuring_allowed():
        return Choice(names[0], {}, OFF)
    t0 = time.perf_counter()
    seconds = (measure or measure_decoding)(model, names, beam=beam, fold_attention=fold_attention)
    name, why = pick(seconds, names)
    rows = " and a ".join(f"{r}-row" for r in (beam, 16 * beam)[:max(len(t) for t in seconds.values())])
    why = f"{why} for a {rows} decoding; measured in {time.perf_counter() - t0:.1f} s"
    save_cached(entry, dict(choice=name, seconds=seconds, why=why))
    return Choice(name, seconds, why)


# --- training -------------------------------------------------------------------------------------------
def measure_training(channels: int, kernel: int, tokens: int, device: torch.device, backend: Optional[str],
                     rounds: int = 5) -> Dict[str, List[float]]:
    """The forward and backward of one conv+GLU layer (``channels`` wide, kernel ``kernel``, a
    batch of ``tokens`` tokens as 25-token sentences) in fp32 and under bf16 autocast, interleaved."""
    import convs2s_kernels as ck

    T = 25
    B = max(1, tokens // T)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(B, T, channels, generator=g).to(device).requires_grad_()
    w = (torch.randn(kernel, channels, 2 * channels, generator=g) / (kernel * channels) ** 0.5).to(device)
    w.requires_grad_()
    b = torch.zeros(2 * channels, device=device, requires_grad=True)

    backend = backend if backend in (None, "auto", "reference") else f"{backend},reference"  # as the model falls back

    def step(bf16: bool):
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            y = ck.conv_glu(x, w, b, causal=True, residual=x, scale=0.5 ** 0.5, backend=backend)
        y.float().sum().backward()
        x.grad = w.grad = b.grad = None
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    medians = time_interleaved({"fp32": lambda: step(False), "bf16": lambda: step(True)}, rounds)
    return {n: [t] for n, t in medians.items()}


def choose_training(precision: str, device: torch.device, *, channels: int, kernel: int, tokens: int,
                    backend: Optional[str] = None, remeasure: bool = False,
                    measure: Optional[Callable[..., Dict[str, List[float]]]] = None) -> Choice:
    """fp32 or bf16 for ``train --precision`` (``auto`` measured as :func:`measure_training`;
    ``CONVS2S_PRECISION`` overrides it)."""
    if precision not in ("fp32", "bf16", "auto"):
        raise Convs2sError(f"precision must be fp32, bf16 or auto, got {precision!r}")
    env = os.environ.get(TRAIN_ENV)
    if precision == "auto" and env and env != "auto":
        if env not in ("fp32", "bf16"):
            raise Convs2sError(f"{TRAIN_ENV} must be fp32, bf16 or auto, got {env!r}")
        return Choice(env, {}, f"{TRAIN_ENV}={env}")
    if precision != "auto":
        return Choice(precision, {}, "asked for")
    if device.type == "cuda" and not torch.cuda.is_bf16_supported():
        return Choice("fp32", {}, "this GPU has no bf16")
    entry = f"train:{_device_name(device)}:{backend or 'auto'}:conv_glu:{channels}x{kernel}:{tokens}"
    cached = None if remeasure else load_cached(entry)
    if cached is not None and cached["choice"] in ("fp32", "bf16"):
        return Choice(cached["choice"], cached["seconds"], cached["why"], cached=True)
    if measure is None and not _measuring_allowed():
        return Choice("fp32", {}, OFF)
    seconds = (measure or measure_training)(channels, kernel, tokens, device, backend)
    name, why = pick(seconds, ["fp32", "bf16"])
    why = f"{why} for a conv+GLU layer's forward+backward ({channels} channels, k={kernel}, {tokens} tokens)"
    save_cached(entry, dict(choice=name, seconds=seconds, why=why))
    return Choice(name, seconds, why)
