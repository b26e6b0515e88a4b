"""The ``convs2s bench`` commands: ``speed-table``, ``vs-fairseq``, ``vs-fairseq-train`` and ``compare``.

:mod:`convs2s.cli` defines their options and imports this module only when one of them runs, so
``convs2s`` itself never loads the benchmarks. Every failure a user can cause is raised as a
:class:`convs2s.errors.Convs2sError` (the command line prints it in one line and exits 2).
"""

from __future__ import annotations

import json
import sys
from typing import Callable, Type, TypeVar

import torch

from convs2s import checks
from convs2s.errors import Convs2sError

T = TypeVar("T")


def _log(msg: str) -> None:
    print(msg, file=sys.stderr)


def _reported_as(error: Type[Convs2sError], call: Callable[[], T]) -> T:
    """``call()``, with a plain ``ValueError`` from below it (convs2s naming an unknown
    architecture, the kernels an unknown backend) raised as ``error``, which the command line
    reports in one line."""
    try:
        return call()
    except Convs2sError:
        raise
    except ValueError as exc:
        raise error(str(exc)) from exc


def _check_output(path, flag: str, error: Type[Convs2sError]) -> None:
    """A file the command will write must be writable where it goes: said before any timing, not after."""
    if path:
        _as(error, checks.writable_file, path, flag)


def _as(error: Type[Convs2sError], check: Callable, *args, **kwargs):
    """``check(*args, **kwargs)`` (one of :mod:`convs2s.checks`), its failure raised as ``error``."""
    try:
        return check(*args, **kwargs)
    except Convs2sError as exc:
        raise error(str(exc)) from None


def _check_inputs(error: Type[Convs2sError], *, checkpoint=None, dicts=None, texts=(), files=()) -> None:
    """The files a bench command reads, checked before anything is built or timed."""
    if checkpoint:
        _as(error, checks.existing_file, checkpoint, "--checkpoint", what="checkpoint")
    if dicts:
        _as(error, checks.existing_folder, dicts, "--dicts")
    for flag, path in texts:
        if path:
            _as(error, checks.text_file, path, flag)
    for flag, path in files:
        if path:
            _as(error, checks.existing_file, path, flag)


def _set_threads(threads: int) -> None:
    if threads:
        torch.set_num_threads(threads)


def speed_table(args) -> int:
    """``convs2s bench speed-table``: time the table, print it, write the JSON and the plot."""
    from .speed_table import (SpeedTableError, SpeedTableRequest, accounting_errors, auto_losses, format_table, run,
                              write_json)

    if args.full and args.sentences is not None:
        raise SpeedTableError("give either --full or --sentences")
    _check_output(args.json, "--json", SpeedTableError)
    _check_output(args.plot, "--plot", SpeedTableError)
    if args.reference and not args.checkpoint:  # the options first, then their files
        raise SpeedTableError("--reference needs --checkpoint: BLEU of random weights means nothing")
    _check_inputs(SpeedTableError, checkpoint=args.checkpoint, dicts=args.dicts,
                  texts=(("--source", args.source), ("--reference", args.reference)), files=(("--spm", args.spm),))
    if args.plot:
        try:
            import matplotlib  # noqa: F401  (drawn after the timings: missing, it must say so now)
        except ImportError as exc:
            raise SpeedTableError(f"--plot needs matplotlib ({exc})") from None
    _set_threads(args.threads)
    mode = "subset" if args.sentences is not None else "full" if args.full or args.checkpoint else "estimate"
    request = SpeedTableRequest(
        arch=args.arch, checkpoint=args.checkpoint, dicts=args.dicts, source=args.source, reference=args.reference,
        spm=args.spm, mode=mode, sentences=args.sentences, beams=args.beams, backends=args.backends,
        device=args.device, dtypes=args.dtype, decoders=args.decoders, repeats=args.repeats,
        batch_size=args.batch_size, vocab=args.vocab, seed=args.seed, cuda_graph=not args.no_cuda_graph,
        remeasure=args.remeasure,
        **({} if args.steps_per_graph is None else {"steps_per_graph": args.steps_per_graph}))
    save = (lambda partial: write_json(partial, args.json)) if args.json else None  # progress survives a kill
    result = _reported_as(SpeedTableError, lambda: run(request, progress=args.progress or sys.stderr.isatty(),
                                                       on_update=save, log=_log))
    print(format_table(result))
    if args.json:
        write_json(result, args.json)
        print(f"\nwrote {args.json}")
    if args.plot:
        from .plot import plot_table

        plot_table(result, args.plot)
        print(f"wrote {args.plot}")
    wrong = accounting_errors(result)
    if wrong:  # after the table is out and saved: the timings stand, the FLOP count or a peak does not
        raise SpeedTableError(f"{', '.join(wrong)} ran above the measured GEMM peak (rows marked '!'): the work "
                              "is miscounted or the peak under-measured")
    lost = auto_losses(result)
    if lost:  # the timings stand; the choice that made them does not
        raise SpeedTableError(f"auto's choice lost to the reference: {'; '.join(lost)}")
    return 0


def vs_fairseq(args) -> int:
    """``convs2s bench vs-fairseq``: fairseq's generator beside convs2s; print and write the comparison."""
    from convs2s.atomic import atomic_write_text

    from .vs_fairseq import VsFairseqError, compare, format_result
    from .workload import Config

    _check_output(args.json, "--json", VsFairseqError)
    _as(VsFairseqError, checks.executable_file, args.fairseq_python, "--fairseq-python")
    _check_inputs(VsFairseqError, checkpoint=args.checkpoint, dicts=args.dicts, texts=(("--input", args.input),))
    _set_threads(args.threads)
    config = Config(args.backend, args.decoder, "fp32") if args.backend else None
    result = _reported_as(VsFairseqError, lambda: compare(
        fairseq_python=args.fairseq_python, checkpoint=args.checkpoint, dicts=args.dicts, input_ids=args.input,
        beams=args.beams, repeats=args.repeats, batch_size=args.batch_size, config=config, int8=args.int8,
        int8_weights_only=args.int8_weights_only, int7=args.int7, int8_encoder=args.int8_encoder,
        int7_encoder=args.int7_encoder, w7a7_encoder=args.w7a7_encoder, log=_log))
    print(format_result(result))
    if args.json:
        atomic_write_text(args.json, json.dumps(result, indent=1))
        print(f"\nwrote {args.json}")
    return 0


def vs_fairseq_train(args) -> int:
    """``convs2s bench vs-fairseq-train``: fairseq's training updates beside convs2s's."""
    from convs2s.atomic import atomic_write_text

    from .vs_fairseq_train import TrainRequest, VsFairseqTrainError, compare, format_result, losses_agree

    _check_output(args.json, "--json", VsFairseqTrainError)
    _as(VsFairseqTrainError, checks.executable_file, args.fairseq_python, "--fairseq-python")
    if args.data:
        _as(VsFairseqTrainError, checks.existing_folder, args.data, "--data")
    _set_threads(args.threads)
    req = TrainRequest(fairseq_python=args.fairseq_python, arch=args.arch, data=args.data, max_tokens=args.max_tokens,
                       updates=args.updates, warmup=args.warmup, repeats=args.repeats,
                       check_updates=args.check_updates, dropout=args.dropout, label_smoothing=args.label_smoothing,
                       vocab=args.vocab, seed=args.seed, backend=args.backend, threads=torch.get_num_threads(),
                       compile_modes=() if args.compile_modes == ["none"] else tuple(args.compile_modes),
                       compile_fairseq=not args.no_compile_fairseq, compile_backend=args.compile_backend)
    save = (lambda partial: atomic_write_text(args.json, json.dumps(partial, indent=1))) if args.json else None
    result = _reported_as(VsFairseqTrainError, lambda: compare(req, log=_log, on_update=save))  # kept per repeat
    print(format_result(result))
    if args.json:
        atomic_write_text(args.json, json.dumps(result, indent=1))
        print(f"\nwrote {args.json}")
    if not losses_agree(result):  # the timings stand; the claim that both trained the same model does not
        raise VsFairseqTrainError(f"the first losses differ by {result['losses']['max_relative_difference']:.1e} "
                                  "(relative): the two systems did not train the same model")
    return 0


def compare(args) -> int:
    """``convs2s bench compare``: pytest-benchmark results pivoted into one table."""
    from .compare import compare as pivot

    print(pivot(args.files, args.format))
    return 0
