"""Command line: ``python -m convs2s <command>`` (or the ``convs2s`` script).

Commands:
  bench      speed-table: the paper's generation-speed table (Table 3), estimated or run in full;
             vs-fairseq: fairseq's own generator beside convs2s (a separate fairseq interpreter);
             vs-fairseq-train: fairseq's training updates beside convs2s's, same weights and batches;
             compare: pivot pytest-benchmark results across machines.
  translate  translate text (stdin or a file) with a fairseq fconv checkpoint (one process, or a
             corpus across processes and machines under torchrun: convs2s.corpus).
  generate   translate a test set, print fairseq-style S-/H-/P-/A- lines and score it with sacrebleu.
  data       prepare a parallel corpus (cleaning, joint BPE, dictionaries) or fetch Multi30k.
  train      train a model on a prepared data folder (one process, or several under torchrun).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import List, Optional

from .errors import Convs2sError


def _number(kind, text: str):
    """``kind(text)``, or argparse's one-line error naming the value (not the parser's function)."""
    try:
        return kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {'a whole number' if kind is int else 'a number'}, "
                                         f"got {text!r}") from None


def _positive_int(text: str) -> int:
    value = _number(int, text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _non_negative(kind):
    def parse(text: str):
        value = _number(kind, text)
        if value < 0:
            raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
        return value

    return parse


def _int_list(text: str) -> List[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a comma-separated list of integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


def _name_list(text: str) -> List[str]:
    values = [v.strip() for v in text.split(",") if v.strip()]
    if not values:
        raise argparse.ArgumentTypeError(f"expected a comma-separated list, got {text!r}")
    return values


# The bench commands live with the benchmarks (bench/): their module is imported only when one runs.
def cmd_speed_table(args) -> int:
    from convs2s_bench.cli import speed_table

    return speed_table(args)


def cmd_vs_fairseq(args) -> int:
    from convs2s_bench.cli import vs_fairseq

    return vs_fairseq(args)


def cmd_vs_fairseq_train(args) -> int:
    from convs2s_bench.cli import vs_fairseq_train

    return vs_fairseq_train(args)


def cmd_bench_compare(args) -> int:
    from convs2s_bench.cli import compare

    return compare(args)


def _check_translation_options(args) -> None:
    """The files first (convs2s.checks: stat calls, before torch is even imported), then the
    options that do not fit together or an unknown backend: all said before the checkpoint is
    loaded, anything measured or an --output opened."""
    from . import checks

    if args.fairseq_checkpoint is None:
        raise Convs2sError("give a model with --fairseq-checkpoint PATH (and --fairseq-dicts DIR if the "
                           "dictionaries are not beside it)")
    if args.spm is not None and args.bpe_codes is not None:
        raise Convs2sError("give --spm or --bpe-codes, not both")
    for flag, path in (("--spm", args.spm), ("--bpe-codes", args.bpe_codes), ("--replace-unk", args.replace_unk),
                       ("--shortlist", args.shortlist)):
        if path is not None:
            checks.existing_file(path, flag)
    from .corpus import checked_here
    from .distributed import launched_by_torchrun

    local = checked_here(args.input, launched_by_torchrun())  # under torchrun the writer's node has the files
    if getattr(args, "output", None) and local:
        checks.writable_file(args.output, "--output")
    if local:
        checks.text_file(args.input, "--input", what="input file")
    if getattr(args, "reference", None) and local:
        checks.text_file(args.reference, "--reference", what="reference file")
    checks.existing_file(args.fairseq_checkpoint, "--fairseq-checkpoint", what="checkpoint")
    if args.fairseq_dicts is not None:
        checks.existing_folder(args.fairseq_dicts, "--fairseq-dicts")

    import convs2s_kernels as ck

    from .compute_type import DECODE_ENV, candidates_for

    candidates_for(args.compute_type)  # an unknown compute type, named
    if os.environ.get(DECODE_ENV, "auto") != "auto":
        candidates_for(os.environ[DECODE_ENV])
    try:
        ck.requested_backends(args.backend)
    except ValueError as exc:
        raise Convs2sError(str(exc)) from None
    from .generate import SearchOptions

    SearchOptions(beam=args.beam, nbest=args.nbest, min_len=args.min_len, max_len_a=args.max_len_a,
                  max_len_b=args.max_len_b).check()


def _chunk_size(args) -> int:
    """--chunk-size, or by default 512 lines at a time; one at a time from a terminal, so that each
    typed line is translated when it is entered."""
    if args.chunk_size:
        return args.chunk_size
    return 1 if args.input in (None, "-") and sys.stdin.isatty() else 512


def _translator(args, compute_type=None):
    """The command's :class:`convs2s.Translator`, its options checked first (_check_translation_options);
    ``compute_type`` replaces --compute-type (the writer's choice, under torchrun)."""
    from .translator import Translator

    return Translator(args.fairseq_checkpoint, dicts=args.fairseq_dicts, compute_type=compute_type or args.compute_type,
                      threads=args.threads or None, backend=args.backend, fold_attention=args.fold_attention,
                      spm=args.spm, bpe_codes=args.bpe_codes, tokenizer=args.tokenizer, remove_bpe=args.remove_bpe,
                      beam=args.beam, remeasure=args.remeasure, trust_pickle=args.trust_pickle, verbose=True,
                      shortlist=args.shortlist, shortlist_top=args.shortlist_top)


def _given(**options) -> dict:
    """The options the command line set (None: the library's default)."""
    return {k: v for k, v in options.items() if v is not None}


def _gen_kwargs(args):
    from .generate import Observer

    return dict(beam=args.beam, nbest=args.nbest, max_len_a=args.max_len_a, max_len_b=args.max_len_b,
                min_len=args.min_len, lenpen=args.lenpen, unkpen=args.unkpen, batch_size=args.batch_size,
                observer=Observer(cuda_graph=False if args.no_cuda_graph else None,
                                  **_given(steps_per_graph=args.steps_per_graph)))


# what a journal of --output must match besides the files (convs2s.corpus.job_key adds their digests)
_OUTPUT_OPTIONS = ("beam", "nbest", "max_len_a", "max_len_b", "min_len", "lenpen", "unkpen", "batch_size",
                   "fold_attention", "backend", "tokenizer", "remove_bpe", "shortlist_top", "replace_unk")


def _run_translation(args, consume, output: Optional[str] = None) -> Optional[int]:
    """Shared driver of translate and generate (convs2s.corpus: one process, or the group under
    torchrun): ``consume`` gets each translation in input order on the writer. Returns the exit
    status, None on the processes that are not the writer."""
    from . import corpus
    from .distributed import default_threads, launched_by_torchrun
    from .translate import load_align_dict

    if launched_by_torchrun() and not args.threads:
        args.threads = default_threads()  # torchrun's own default is one thread a process
    search = dict(_gen_kwargs(args), need_alignment=getattr(args, "print_alignment", False),
                  align_dict=load_align_dict(args.replace_unk) if args.replace_unk else None)
    key = {name: getattr(args, name) for name in _OUTPUT_OPTIONS}
    key["replace_unk"] = corpus.file_digest(args.replace_unk) if args.replace_unk else None
    job = corpus.Job(lambda compute_type: _translator(args, compute_type), args.input, _chunk_size(args), consume,
                     key, output=output, search=search, progress=sys.stderr.isatty() or args.progress)
    truncated = corpus.run(job)
    if truncated is None:
        return None
    return 1 if truncated else 0  # every line translated, but not all of some: status 1 says so


def cmd_translate(args) -> int:
    if args.nbest > 1:  # its output is one line per input line
        raise Convs2sError("translate writes one line per input line; for n-best lists use "
                           "`convs2s generate --nbest N`")
    _check_translation_options(args)
    from .translate import write_lines

    def consume(tr):  # --output: convs2s.corpus writes it a chunk at a time, journalled
        if not args.output:
            write_lines(sys.stdout, [h["text"] for h in tr.hypotheses] or [""])
    rc = _run_translation(args, consume, output=args.output)
    return 0 if rc is None else rc


def cmd_generate(args) -> int:
    _check_translation_options(args)
    import sacrebleu

    from .translate import format_fairseq_lines, read_lines, write_lines

    hyps: list = []

    def consume(tr):
        write_lines(sys.stdout, format_fairseq_lines(tr.lineno - 1, tr, args.print_alignment))
        hyps.append(tr.hypotheses[0]["text"] if tr.hypotheses else "")

    rc = _run_translation(args, consume)
    if rc is None:  # another process of the group: the writer scores the whole set
        return 0
    if args.reference:
        refs = [text for _, text in read_lines(args.reference)]
        if len(refs) != len(hyps):
            print(f"error: {args.reference} has {len(refs)} lines but {args.input} has {len(hyps)}", file=sys.stderr)
            return 2
        bleu = sacrebleu.metrics.BLEU()
        score = bleu.corpus_score(hyps, [refs])
        print(f"{score} (signature: {bleu.get_signature()})")
    return rc


def cmd_data_prepare(args) -> int:
    from . import checks
    from .data import prepare, resolve_corpus_file

    for flag, prefix in (("--train", args.train), ("--valid", args.valid)):
        for lang in (args.source_lang, args.target_lang) if prefix is not None else ():
            try:
                path = resolve_corpus_file(prefix, lang)
            except FileNotFoundError as exc:
                raise Convs2sError(f"{flag} {prefix}: {exc}") from None
            checks.text_file(path, flag, what="corpus file")
    checks.writable_folder(args.out, "--out")

    prepare(args.out, args.source_lang, args.target_lang, args.train, args.valid, bpe_size=args.bpe_size,
            max_len=args.max_len or None, max_ratio=args.max_ratio or None, seed=args.seed)
    return 0


def cmd_data_multi30k(args) -> int:
    from .multi30k import download

    files = download(args.out, args.langs.split(","), **({"mirror": args.mirror} if args.mirror else {}))
    print(f"{len(files)} files in {args.out}")
    return 0


def cmd_average_checkpoints(args) -> int:
    from .average import last_epoch_checkpoints, write_average

    if bool(args.inputs) == bool(args.folder):
        raise Convs2sError("give either the checkpoints to average (--inputs A B ...) or a folder (--folder DIR "
                           "with --num-epoch-checkpoints N)")
    from . import checks

    checks.writable_file(args.output, "--output")
    paths = args.inputs or last_epoch_checkpoints(args.folder, args.num_epoch_checkpoints)
    for path in paths:
        checks.existing_file(path, "--inputs" if args.inputs else "--folder", what="checkpoint")
    out = write_average(paths, args.output, trust_pickle=args.trust_pickle)
    print(f"{out}: the mean of {len(paths)} checkpoints ({', '.join(Path(p).name for p in paths)})")
    return 0


def _model_option(text: str):
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    import ast

    try:
        value = ast.literal_eval(value)
    except (ValueError, SyntaxError):
        pass  # a plain string such as a layer spec
    return key.replace("-", "_"), value


def train_config_from_args(args):
    from .train import TrainConfig

    overrides = dict(args.model_option or [])
    if args.dropout is not None:
        overrides["dropout"] = args.dropout
    return TrainConfig(
        data=args.data, save_dir=args.save_dir, arch=args.arch, model_overrides=overrides, lr=args.lr,
        momentum=args.momentum, weight_decay=args.weight_decay, clip_norm=args.clip_norm, lr_shrink=args.lr_shrink,
        min_lr=args.min_lr, label_smoothing=args.label_smoothing, max_tokens=args.max_tokens,
        max_sentences=args.max_sentences, update_freq=args.update_freq, max_epoch=args.max_epoch,
        max_update=args.max_update, max_time_minutes=args.max_time, decay_minutes=args.decay_minutes,
        validate_interval_updates=args.validate_interval,
        save_interval_updates=args.save_interval, snapshot_minutes=args.snapshot_minutes or [],
        keep_last_epochs=args.keep_last_epochs,
        log_interval=args.log_interval, seed=args.seed, bf16=args.precision == "bf16", threads=args.threads,
        backend=args.backend,
    )


def _train_precision(args, cfg) -> bool:
    """bf16 autocast for ``--precision`` on the device training will use (``auto``: measured on a
    conv+GLU layer of the architecture at the batch's shape, or the cached answer), saying why on
    stderr. Several processes never measure at once on shared cores: they read the cache, else fp32."""
    import torch

    from .architectures import get_config
    from .train import bf16_autocast

    if args.threads:
        torch.set_num_threads(args.threads)  # measured with the threads training will use
    model_cfg = get_config(cfg.arch, **cfg.model_overrides)
    channels, kernel = max(model_cfg.decoder_layers, key=model_cfg.decoder_layers.count)[:2]
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    from convs2s_kernels.tune import measuring

    with measuring(int(os.environ.get("WORLD_SIZE", "1")) == 1):
        bf16, why = bf16_autocast(args.precision, device, channels=channels, kernel=kernel, tokens=cfg.max_tokens,
                                  backend=cfg.backend, remeasure=args.remeasure)
    print(f"precision: {why}", file=sys.stderr)
    return bf16


def _check_training_files(args) -> None:
    """The data folder and its training split, and a save folder that takes files and holds no
    run unless --resume: said before the precision is measured or the data loaded (under torchrun
    the trainer says the last, once its group knows whether it is a restart)."""
    from . import checks
    from .data import DataError, open_data_folder
    from .distributed import launched_by_torchrun
    from .train import last_checkpoint

    checks.existing_folder(args.data, what="data folder")
    try:
        folder = open_data_folder(args.data)
    except (FileNotFoundError, DataError) as exc:
        raise Convs2sError(str(exc)) from None
    checks.existing_file(folder.split_path("train"), what="training split")
    last = last_checkpoint(checks.writable_folder(args.save_dir, "--save-dir"), args.resume or launched_by_torchrun())
    if last.exists():  # resuming: a file to read
        checks.existing_file(last, what="checkpoint")


def cmd_train(args) -> int:
    from .distributed import restarted
    from .architectures import get_config
    from .train import StopKind, Trainer, TrainingDiverged, init_distributed

    import convs2s_kernels as ck

    cfg = train_config_from_args(args)
    try:  # bad architecture options or an unknown backend fail before data loading
        get_config(cfg.arch, **cfg.model_overrides)
        ck.requested_backends(cfg.backend)
    except (TypeError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    _check_training_files(args)
    cfg.bf16 = _train_precision(args, cfg)
    try:
        info = init_distributed()
        args.resume = args.resume or restarted()  # a group torchrun restarted (--max-restarts): continue, as --resume does
        trainer = Trainer(cfg, info)
        summary = trainer.train(resume=args.resume, progress_bar=True if args.progress else None)
    except TrainingDiverged as exc:
        last = Path(cfg.save_dir) / "checkpoint_last.pt"
        kept = f"the last good checkpoint is {last}" if last.is_file() else "no checkpoint was written yet"
        print(f"error: {exc}; training stopped, {kept}. Lower --lr or --clip-norm, or drop --bf16.", file=sys.stderr)
        return 3
    finally:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
    return 130 if summary["stop"] is StopKind.SIGNAL else 0


def _add_generation_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--fairseq-checkpoint", help="a fairseq fconv checkpoint (model.pt)")
    p.add_argument("--fairseq-dicts", help="folder with dict.<src>.txt and dict.<tgt>.txt (default: beside it)")
    p.add_argument("--trust-pickle", action="store_true",
                   help="load checkpoints with the full unpickler (can run code from the file)")
    p.add_argument("--input", default="-", help="input text, one sentence per line ('-': stdin)")
    p.add_argument("--spm", help="sentencepiece model: applied to the input and removed from the output "
                                 "(default: spm.model beside the checkpoint, as `convs2s train` writes it)")
    p.add_argument("--bpe-codes", help="subword-nmt BPE codes applied to the input, their '@@ ' removed from the output "
                                       "(default: bpecodes beside the checkpoint, as fairseq's released models have)")
    p.add_argument("--tokenizer", choices=["moses"], default=None,
                   help="Moses-tokenise the input and detokenise the output (sacremoses; fairseq's released models)")
    p.add_argument("--remove-bpe", nargs="?", const="@@ ", default=None,
                   help="remove subword-nmt BPE continuation markers from the output (default marker '@@ ')")
    p.add_argument("--beam", type=_positive_int, default=5)
    p.add_argument("--nbest", type=_positive_int, default=1)
    p.add_argument("--max-len-a", type=_non_negative(float), default=0.0)
    p.add_argument("--max-len-b", type=_non_negative(int), default=200)
    p.add_argument("--min-len", type=_non_negative(int), default=1)
    p.add_argument("--lenpen", type=float, default=1.0)
    p.add_argument("--unkpen", type=float, default=0.0)
    p.add_argument("--replace-unk", metavar="DICT", help="replace <unk> using this word-pair dictionary")
    p.add_argument("--batch-size", type=_positive_int, default=128)
    p.add_argument("--chunk-size", type=_positive_int, default=None,
                   help="lines translated (and written) at a time (default 512; 1 when typing into a terminal)")
    p.add_argument("--backend", default=None, help="kernel backend: auto, cpp, triton, reference")
    p.add_argument("--fold-attention", action=argparse.BooleanOptionalAction, default=True,
                   help="precompute the attention projections per sentence (the same n-best lists, faster steps; "
                        "the default)")
    p.add_argument("--no-cuda-graph", action="store_true",
                   help="on CUDA, run every decoding step eagerly instead of replaying it as a CUDA graph")
    p.add_argument("--steps-per-graph", type=_positive_int, default=None,
                   help="decoding steps one CUDA graph holds (default: convs2s.generate.STEPS_PER_GRAPH, 4)")
    p.add_argument("--shortlist", metavar="FILE",
                   help="vocabulary selection: score only the target words FILE lists for the batch's source "
                        "words ('src tgt1 tgt2 ...' per line) plus the --shortlist-top most frequent")
    p.add_argument("--shortlist-top", type=_non_negative(int), default=100,
                   help="most frequent target words always scored with --shortlist (default 100)")
    p.add_argument("--compute-type", default="auto", metavar="TYPE",
                   help="auto (default): the faster of fp32 and bf16 on this machine for this model, measured once "
                        "and cached; fp32; bf16; int8: the fastest int8 variant, measured likewise (a small "
                        "translation-quality cost; experts may name one: int8, int8w, int7, w7a7, int8e, int7e, "
                        "w7a7e). CONVS2S_COMPUTE_TYPE overrides auto")
    p.add_argument("--remeasure", action="store_true", help="measure --compute-type auto/int8's choice again")
    p.add_argument("--threads", type=_non_negative(int), default=0,
                   help="torch threads (0: torch's default; under torchrun the node's cores divided among its processes)")
    p.add_argument("--progress", action="store_true", help="show the progress bar even when stderr is no terminal")


def _add_bench_parser(sub) -> None:
    bench = sub.add_parser("bench", help="the paper's generation-speed table; compare benchmark results")
    bsub = bench.add_subparsers(dest="bench_command", required=True)
    _add_speed_table_parser(bsub)
    _add_vs_fairseq_parser(bsub)
    _add_vs_fairseq_train_parser(bsub)
    cmp_p = bsub.add_parser("compare", help="pivot pytest-benchmark JSON files into one table across machines")
    cmp_p.add_argument("files", nargs="+")
    cmp_p.add_argument("--format", choices=("markdown", "csv"), default="markdown")
    cmp_p.set_defaults(func=cmd_bench_compare)


def _add_speed_table_parser(bsub) -> None:
    st = bsub.add_parser("speed-table", help="Table 3 of the paper: beam 1 / beam 5 generation time per backend")
    st.add_argument("--arch", default="fconv_wmt_en_fr", help="architecture for random weights")
    st.add_argument("--checkpoint", help="a fairseq fconv checkpoint instead of random weights")
    st.add_argument("--dicts", help="folder with the checkpoint's dictionaries (default: beside it)")
    st.add_argument("--source", help="tokenised source text, one sentence per line (default: synthetic "
                                     "sentences with newstest2012+2013's length distribution)")
    st.add_argument("--reference", help="reference translations: report BLEU (needs --checkpoint)")
    st.add_argument("--spm", help="sentencepiece model for --source and the output (with --checkpoint)")
    st.add_argument("--sentences", type=_positive_int, default=None,
                    help="time the first N sentences of a fixed shuffled order, whole (no full-set estimate)")
    st.add_argument("--full", action="store_true",
                    help="run every sentence (6003 for newstest) instead of estimating the full set from a sample")
    st.add_argument("--beams", type=_int_list, default=[1, 5])
    st.add_argument("--backends", type=_name_list, default=None,
                    help="comma-separated; with --backends/--dtype/--decoders every combination is timed "
                         "(default: the reference baseline and the fastest configuration of this machine)")
    st.add_argument("--device", default="cpu")
    st.add_argument("--no-cuda-graph", action="store_true",
                    help="on CUDA, decode every step eagerly instead of replaying it as a CUDA graph")
    st.add_argument("--steps-per-graph", type=_positive_int, default=None,
                    help="decoding steps one CUDA graph holds (default: convs2s.generate.STEPS_PER_GRAPH, 4)")
    st.add_argument("--dtype", type=_name_list, default=None,
                    help="auto (fp32 or bf16, whichever was measured faster here for this model), "
                         "fp32, bf16, int8 (int8 decoder weights and activations), int8w (int8 decoder weights, "
                         "fp32 activations), int7 (int8 decoder weights, 7-bit activations), w7a7 (7-bit decoder weights "
                         "and activations), comma-separated")
    st.add_argument("--decoders", type=_name_list, default=None,
                    help="plain and/or folded (attention projections precomputed per sentence; exact)")
    st.add_argument("--repeats", type=_positive_int, default=3, help="timings per row (median and range)")
    st.add_argument("--remeasure", action="store_true", help="measure the auto dtype's choice again")
    st.add_argument("--batch-size", type=_positive_int, default=128)
    st.add_argument("--vocab", type=_positive_int, default=40000, help="vocabulary size for random weights")
    st.add_argument("--threads", type=_non_negative(int), default=0, help="torch threads (0: default)")
    st.add_argument("--seed", type=int, default=1)
    st.add_argument("--json", help="also write the numbers here (updated after every timing)")
    st.add_argument("--plot", help="draw the table beside the paper's rows into this PNG (matplotlib)")
    st.add_argument("--progress", action="store_true", help="show progress bars even when stderr is no terminal")
    st.set_defaults(func=cmd_speed_table)


def _add_vs_fairseq_parser(bsub) -> None:
    vs = bsub.add_parser("vs-fairseq", help="fairseq's own generator beside convs2s: same checkpoint, sentences, "
                                            "batches and forced lengths; times, ratio and output agreement")
    vs.add_argument("--fairseq-python", required=True, help="python of a venv with fairseq installed")
    vs.add_argument("--checkpoint", required=True, help="a fairseq fconv checkpoint (dictionaries beside it)")
    vs.add_argument("--dicts", help="folder with the checkpoint's dictionaries (default: beside it)")
    vs.add_argument("--input", required=True, help="source sentences as word ids, one sentence per line")
    vs.add_argument("--beams", type=_int_list, default=[1, 5])
    vs.add_argument("--repeats", type=_positive_int, default=1, help="timings per system and beam, interleaved")
    vs.add_argument("--batch-size", type=_positive_int, default=128)
    vs.add_argument("--backend", choices=("cpp", "reference"), help="convs2s backend (default: cpp where built)")
    vs.add_argument("--decoder", choices=("plain", "folded"), default="folded")
    vs.add_argument("--threads", type=_non_negative(int), default=0, help="torch threads for both (0: default)")
    vs.add_argument("--int8", action="store_true",
                    help="also time convs2s with int8 decoder weights and activations (convs2s-int8)")
    vs.add_argument("--int8-weights-only", action="store_true",
                    help="also time convs2s with int8 decoder weights and float32 activations (convs2s-int8w)")
    vs.add_argument("--int7", action="store_true",
                    help="also time convs2s with int8 decoder weights and 7-bit activations (convs2s-int7)")
    vs.add_argument("--int8-encoder", action="store_true",
                    help="also time convs2s with int8 encoder and decoder weights and activations (convs2s-int8e)")
    vs.add_argument("--int7-encoder", action="store_true",
                    help="also time convs2s with int8 encoder and decoder weights and 7-bit activations (convs2s-int7e)")
    vs.add_argument("--w7a7-encoder", action="store_true",
                    help="also time convs2s-int7e with the decoder's weights in 7 bits too (convs2s-w7a7e)")
    vs.add_argument("--json", help="also write the numbers here")
    vs.set_defaults(func=cmd_vs_fairseq)


def _add_vs_fairseq_train_parser(bsub) -> None:
    vt = bsub.add_parser("vs-fairseq-train", help="fairseq's training updates beside convs2s's: same initial weights, "
                                                  "batches and settings; target tokens/s, ratio, first losses")
    vt.add_argument("--fairseq-python", required=True, help="python of a venv with fairseq installed")
    vt.add_argument("--arch", default="fconv_iwslt_de_en")
    vt.add_argument("--data", help="a prepared data folder (its training split's first batches; default: random "
                                   "sentences of Multi30k's lengths)")
    vt.add_argument("--max-tokens", type=_positive_int, default=1000, help="padded tokens per batch (the recipe's)")
    vt.add_argument("--updates", type=_positive_int, default=40, help="timed updates per repeat")
    vt.add_argument("--warmup", type=_non_negative(int), default=3, help="untimed updates before each timed pass")
    vt.add_argument("--repeats", type=_positive_int, default=3, help="timed passes per system, interleaved")
    vt.add_argument("--check-updates", type=_positive_int, default=3,
                    help="updates whose losses are compared (dropout 0, from the initial weights)")
    vt.add_argument("--dropout", type=_non_negative(float), default=0.2)
    vt.add_argument("--label-smoothing", type=_non_negative(float), default=0.1)
    vt.add_argument("--vocab", type=_positive_int, default=8000, help="vocabulary of the random sentences")
    vt.add_argument("--backend", default=None, help="convs2s kernel backend: auto, cpp, reference")
    vt.add_argument("--threads", type=_non_negative(int), default=0, help="torch threads for both (0: default)")
    vt.add_argument("--seed", type=int, default=1)
    vt.add_argument("--compile-modes", type=_name_list, default=["default", "max-autotune-no-cudagraphs"],
                    help="torch.compile modes of the added rows, comma-separated: convs2s's reference model "
                         "eager and compiled, fairseq's model compiled ('none': no added rows)")
    vt.add_argument("--no-compile-fairseq", action="store_true", help="no rows of fairseq's model compiled")
    vt.add_argument("--compile-backend", default="inductor",
                    help="torch.compile backend of those rows (aot_eager: the graphs without inductor)")
    vt.add_argument("--json", help="also write the numbers here")
    vt.set_defaults(func=cmd_vs_fairseq_train)


def _add_translation_parsers(sub) -> None:
    tr = sub.add_parser("translate", help="translate text with a fairseq fconv checkpoint")
    _add_generation_options(tr)
    tr.add_argument("--output", help="write translations here (default: stdout)")
    tr.set_defaults(func=cmd_translate)

    gen = sub.add_parser("generate", help="fairseq-style S-/H-/P- lines for a test set, with sacrebleu")
    _add_generation_options(gen)
    gen.add_argument("--reference", help="reference translations (detokenised) for sacrebleu")
    gen.add_argument("--print-alignment", action="store_true", help="print A- lines (argmax attention)")
    gen.set_defaults(func=cmd_generate)


def _add_data_parser(sub) -> None:
    data = sub.add_parser("data", help="prepare a corpus or fetch Multi30k")
    dsub = data.add_subparsers(dest="data_command", required=True)
    prep = dsub.add_parser("prepare", help="clean, learn joint sentencepiece BPE, write dictionaries and binaries")
    prep.add_argument("--train", required=True, metavar="PREFIX",
                      help="training corpus: PREFIX.<lang> or PREFIX.<lang>.gz for both languages")
    prep.add_argument("--valid", metavar="PREFIX", help="validation corpus prefix")
    prep.add_argument("--source-lang", "-s", required=True)
    prep.add_argument("--target-lang", "-t", required=True)
    prep.add_argument("--out", required=True, help="data folder to write")
    prep.add_argument("--bpe-size", type=_positive_int, default=8000, help="joint BPE vocabulary size")
    prep.add_argument("--max-len", type=_non_negative(int), default=175,
                      help="drop training pairs with more words on either side (0: no limit; paper: 175)")
    prep.add_argument("--max-ratio", type=_non_negative(float), default=1.5,
                      help="drop training pairs whose word-count ratio exceeds this (0: no limit; paper: 1.5)")
    prep.add_argument("--seed", type=int, default=1)
    prep.set_defaults(func=cmd_data_prepare)
    m30k = dsub.add_parser("multi30k", help="fetch Multi30k task 1 (raw) from its public repository")
    m30k.add_argument("--out", required=True)
    m30k.add_argument("--langs", default="en,de", help="comma-separated: en, de, fr")
    m30k.add_argument("--mirror", default=None, help="base URL or local folder holding the .gz files "
                      "(default: the dataset's GitHub repository)")
    m30k.set_defaults(func=cmd_data_multi30k)


def _add_train_parser(sub) -> None:
    train_p = sub.add_parser("train", help="train on a prepared data folder (NAG, clipping, plateau annealing)")
    train_p.add_argument("data", help="data folder written by `convs2s data prepare`")
    train_p.add_argument("--save-dir", required=True, help="checkpoints, dictionaries and train_log.jsonl go here")
    train_p.add_argument("--arch", default="fconv_iwslt_de_en")
    train_p.add_argument("--dropout", type=float, help="dropout (default: the architecture's)")
    train_p.add_argument("--model-option", type=_model_option, action="append", metavar="KEY=VALUE",
                    help="other architecture fields, e.g. decoder_layers='[(256, 3)] * 4'")
    train_p.add_argument("--lr", type=float, default=0.25)
    train_p.add_argument("--momentum", type=float, default=0.99)
    train_p.add_argument("--weight-decay", type=_non_negative(float), default=0.0)
    train_p.add_argument("--clip-norm", type=_non_negative(float), default=0.1,
                    help="renormalise gradients whose norm exceeds this (0: off)")
    train_p.add_argument("--lr-shrink", type=float, default=0.1, help="factor applied when validation stops improving")
    train_p.add_argument("--min-lr", type=float, default=1e-4, help="stop when the learning rate falls below this")
    train_p.add_argument("--label-smoothing", type=_non_negative(float), default=0.0)
    train_p.add_argument("--max-tokens", type=_positive_int, default=4000, help="padded tokens per batch")
    train_p.add_argument("--max-sentences", type=_positive_int, default=None, help="sentences per batch at most")
    train_p.add_argument("--update-freq", type=_positive_int, default=1, help="batches accumulated per update")
    train_p.add_argument("--max-epoch", type=_non_negative(int), default=0, help="0: no limit")
    train_p.add_argument("--max-update", type=_non_negative(int), default=0, help="0: no limit")
    train_p.add_argument("--max-time", type=_non_negative(float), default=0.0, help="minutes of training (0: no limit)")
    train_p.add_argument("--decay-minutes", type=_non_negative(float), default=0.0,
                         help="take the lr linearly to zero over the last M minutes of --max-time (0: off)")
    train_p.add_argument("--validate-interval", type=_non_negative(int), default=0,
                    help="validate every N updates (0: every epoch)")
    train_p.add_argument("--save-interval", type=_non_negative(int), default=0,
                    help="also write checkpoint_last.pt every N updates")
    train_p.add_argument("--snapshot-minutes", type=lambda t: [float(v) for v in t.split(",") if v], default=None,
                    help="keep checkpoint_<m>min.pt at these minutes of training, e.g. 30,60")
    train_p.add_argument("--keep-last-epochs", type=_non_negative(int), default=0,
                    help="keep checkpoint<epoch>.pt for the last N epochs (to average them; 0: none)")
    train_p.add_argument("--log-interval", type=_positive_int, default=50, help="updates per train_log.jsonl record")
    train_p.add_argument("--seed", type=int, default=1)
    train_p.add_argument("--precision", choices=("fp32", "bf16", "auto"), default="fp32",
                         help="auto: bf16 autocast where a conv+GLU layer's forward+backward was measured faster "
                              "in it than in fp32 on this machine (measured once, cached; CONVS2S_PRECISION "
                              "overrides it)")
    train_p.add_argument("--remeasure", action="store_true", help="measure --precision auto's choice again")
    train_p.add_argument("--bf16", dest="precision", action="store_const", const="bf16",
                         help="same as --precision bf16")
    train_p.add_argument("--threads", type=_non_negative(int), default=0, help="torch threads (0: default)")
    train_p.add_argument("--backend", default=None, help="kernel backend: auto, cpp, triton, reference")
    train_p.add_argument("--resume", action="store_true", help="continue from SAVE_DIR/checkpoint_last.pt")
    train_p.add_argument("--progress", action="store_true", help="show the progress bar even when stderr is no terminal")
    train_p.set_defaults(func=cmd_train)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="convs2s", description="ConvS2S on fused kernels")
    sub = parser.add_subparsers(dest="command", required=True)
    _add_bench_parser(sub)
    _add_translation_parsers(sub)
    _add_data_parser(sub)
    _add_train_parser(sub)
    avg = sub.add_parser("average-checkpoints", help="average the parameters of a run's last checkpoints")
    avg.add_argument("--inputs", nargs="+", help="checkpoints to average")
    avg.add_argument("--folder", help="a save folder: average its last --num-epoch-checkpoints checkpoint<N>.pt")
    avg.add_argument("--num-epoch-checkpoints", type=_positive_int, default=10)
    avg.add_argument("--output", required=True, help="where to write the averaged checkpoint")
    avg.add_argument("--trust-pickle", action="store_true", help="load with the full unpickler")
    avg.set_defaults(func=cmd_average_checkpoints)
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # e.g. piped into `head`: the reader has what it wanted
        sys.stderr.close()
        return 0
    except Convs2sError as exc:  # bad input, named in one line: never a traceback
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except RuntimeError as exc:  # a backend named strictly (e.g. in CONVS2S_KERNELS_BACKEND) that cannot run an op
        from convs2s_kernels.dispatch import BackendUnavailableError

        if not isinstance(exc, BackendUnavailableError):
            raise
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        # a missing input (the readers name it), or a path that can't be read or written; another OSError
        # (a socket, a full disk mid-run) is no input of the user's: its traceback shows where
        if exc.filename is None and not isinstance(exc, FileNotFoundError):
            raise
        print(f"error: {exc}", file=sys.stderr)  # a file that can't be read or written, named
        return 2
