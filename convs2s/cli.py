"""Command line: ``python -m convs2s <command>`` (or the ``convs2s`` script).

Commands:
  demo       short beam-1 / beam-5 generation run of the paper's WMT'14 En-Fr architecture
             (random weights, fixed seed, synthetic newstest-like source lengths), per backend.
  translate  translate text (stdin or a file) with a fairseq fconv checkpoint.
  generate   translate a test set, print fairseq-style S-/H-/P-/A- lines and score it with sacrebleu.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import List, Optional

import torch


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _non_negative(kind):
    def parse(text: str):
        value = kind(text)
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


def cmd_demo(args) -> int:
    import convs2s
    import convs2s_kernels as ck

    avail = ck.available_backends()
    backends = [b for b in args.backends.split(",") if b]
    for b in backends:
        if b not in avail:
            print(f"error: unknown backend {b!r}; known: {', '.join(avail)}", file=sys.stderr)
            return 2
    torch.manual_seed(args.seed)
    t0 = time.perf_counter()
    model = convs2s.build_model(args.arch, args.vocab, args.vocab).eval()
    build_s = time.perf_counter() - t0
    print(f"{args.arch}: {model.num_parameters():,} parameters ({args.vocab} / {args.vocab} vocabularies, "
          f"random weights, seed {args.seed}), built in {build_s:.1f} s; torch threads {torch.get_num_threads()}")
    gen = torch.Generator().manual_seed(args.seed)
    # Lengths near the newstest2012+2013 mean (22.95 tokens), a few sentences per length so that
    # the paper's equal-length batching has something to batch.
    lengths = [args.lengths[i % len(args.lengths)] for i in range(args.sentences)]
    sources = [torch.randint(4, args.vocab, (L,), generator=gen).tolist() for L in lengths]
    target = [int(round(1.1 * L)) for L in lengths]  # forced output length (random weights)
    print(f"{len(sources)} sentences, source lengths {sorted(set(lengths))}, output forced to ~1.1x source length")
    print(f"{'backend':<10} {'beam':>4} {'seconds':>8} {'sent/s':>7} {'tok/s':>7}")
    for backend in backends:
        if avail[backend] is not None:
            print(f"{backend:<10} skipped: {avail[backend]}")
            continue
        model.use_backend(backend)
        # warm-up outside the timing: first-call allocations and the cached weight-norm weights
        convs2s.generate(model, sources[:1], beam=1, max_len_b=2)
        for beam in args.beams:
            t0 = time.perf_counter()
            out = convs2s.generate(model, sources, beam=beam, max_len_a=1.2, max_len_b=10,
                                   batch_size=args.batch_size, eos_suppress_until=target)
            secs = time.perf_counter() - t0
            toks = sum(len(h[0]["tokens"]) for h in out)
            print(f"{backend:<10} {beam:>4} {secs:>8.2f} {len(out) / secs:>7.2f} {toks / secs:>7.1f}")
    model.use_backend(None)
    return 0


def _load_for_translation(args):
    import convs2s
    import convs2s_kernels as ck

    if args.fairseq_checkpoint is None:
        raise SystemExit("error: give a model with --fairseq-checkpoint PATH (and --fairseq-dicts DIR if the "
                         "dictionaries are not beside it)")
    try:  # check the backend before the (slow) checkpoint load
        ck.dispatch.requested_backends(args.backend)
    except ValueError as exc:
        raise SystemExit(f"error: {exc}") from None
    model, src_dict, tgt_dict = convs2s.load_fairseq(args.fairseq_checkpoint, args.fairseq_dicts,
                                                      trust_pickle=args.trust_pickle)
    model.use_backend(args.backend)
    return model, src_dict, tgt_dict


def _gen_kwargs(args):
    return dict(beam=args.beam, nbest=args.nbest, max_len_a=args.max_len_a, max_len_b=args.max_len_b,
                min_len=args.min_len, lenpen=args.lenpen, unkpen=args.unkpen, batch_size=args.batch_size)


def _run_translation(args, consume) -> int:
    """Shared driver: load, translate chunk by chunk, hand each translation to ``consume``."""
    from tqdm.auto import tqdm

    from .translate import Tokenizer, load_align_dict, read_lines, translate_lines

    model, src_dict, tgt_dict = _load_for_translation(args)
    tokenizer = Tokenizer(args.spm, args.remove_bpe)
    align_dict = load_align_dict(args.replace_unk) if args.replace_unk else None
    bar = tqdm(unit="sent", desc=args.command, disable=not sys.stderr.isatty() and not args.progress)
    for tr in translate_lines(model, src_dict, tgt_dict, read_lines(args.input), tokenizer,
                              chunk_size=args.chunk_size, align_dict=align_dict,
                              need_alignment=getattr(args, "print_alignment", False), **_gen_kwargs(args)):
        if tr.note:
            print(f"warning: {tr.note}", file=sys.stderr)
        consume(tr)
        bar.update(1)
    bar.close()
    return 0


def cmd_translate(args) -> int:
    from .translate import write_lines

    out = open(args.output, "w", encoding="utf-8") if args.output else sys.stdout
    try:
        return _run_translation(
            args, lambda tr: write_lines(out, [h["text"] for h in tr.hypotheses] or [""]))
    finally:
        if out is not sys.stdout:
            out.close()


def cmd_generate(args) -> int:
    import sacrebleu

    from .translate import format_fairseq_lines, read_lines, write_lines

    refs = None
    if args.reference:
        refs = [text for _, text in read_lines(args.reference)]
    hyps: list = []

    def consume(tr):
        write_lines(sys.stdout, format_fairseq_lines(tr.lineno - 1, tr, args.print_alignment))
        hyps.append(tr.hypotheses[0]["text"] if tr.hypotheses else "")

    _run_translation(args, consume)
    if refs is not None:
        if len(refs) != len(hyps):
            print(f"error: {args.reference} has {len(refs)} lines but {args.input} has {len(hyps)}", file=sys.stderr)
            return 2
        bleu = sacrebleu.metrics.BLEU()
        score = bleu.corpus_score(hyps, [refs])
        print(f"{score} (signature: {bleu.get_signature()})")
    return 0


def _add_generation_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--fairseq-checkpoint", help="a fairseq fconv checkpoint (model.pt)")
    p.add_argument("--fairseq-dicts", help="folder with dict.<src>.txt and dict.<tgt>.txt (default: beside it)")
    p.add_argument("--trust-pickle", action="store_true",
                   help="load checkpoints with the full unpickler (can run code from the file)")
    p.add_argument("--input", default="-", help="input text, one sentence per line ('-': stdin)")
    p.add_argument("--spm", help="sentencepiece model: applied to the input and removed from the output")
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
    p.add_argument("--chunk-size", type=_positive_int, default=512, help="lines translated (and written) at a time")
    p.add_argument("--backend", default=None, help="kernel backend: auto, cpp, triton, reference")
    p.add_argument("--progress", action="store_true", help="show the progress bar even when stderr is no terminal")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="convs2s", description="ConvS2S on fused kernels")
    sub = parser.add_subparsers(dest="command", required=True)

    demo = sub.add_parser("demo", help="short generation run of the paper's En-Fr architecture (random weights)")
    demo.add_argument("--arch", default="fconv_wmt_en_fr")
    demo.add_argument("--vocab", type=_positive_int, default=40000, help="source and target vocabulary size")
    demo.add_argument("--sentences", type=_positive_int, default=8)
    demo.add_argument("--lengths", type=_int_list, default=[21, 23], help="source lengths to cycle through")
    demo.add_argument("--beams", type=_int_list, default=[1, 5])
    demo.add_argument("--backends", default="reference,cpp", help="comma-separated backends to time")
    demo.add_argument("--batch-size", type=_positive_int, default=128)
    demo.add_argument("--seed", type=int, default=1)
    demo.set_defaults(func=cmd_demo)

    tr = sub.add_parser("translate", help="translate text with a fairseq fconv checkpoint")
    _add_generation_options(tr)
    tr.add_argument("--output", help="write translations here (default: stdout)")
    tr.set_defaults(func=cmd_translate)

    gen = sub.add_parser("generate", help="fairseq-style S-/H-/P- lines for a test set, with sacrebleu")
    _add_generation_options(gen)
    gen.add_argument("--reference", help="reference translations (detokenised) for sacrebleu")
    gen.add_argument("--print-alignment", action="store_true", help="print A- lines (argmax attention)")
    gen.set_defaults(func=cmd_generate)
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    from .fairseq_io import CheckpointError
    from .translate import InputError

    try:
        return args.func(args)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # e.g. piped into `head`: the reader has what it wanted
        sys.stderr.close()
        return 0
    except (FileNotFoundError, CheckpointError, InputError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
