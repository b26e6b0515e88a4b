"""Text in, text out: tokenise, translate in chunks, detokenise, replace unknown words.

Used by ``convs2s translate`` and ``convs2s generate``. Input is read as strict UTF-8 (a bad
byte sequence is reported with its line number); translations are written chunk by chunk in
input order, so an interrupted run keeps everything finished so far.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Sequence, TextIO, Tuple

from .dictionary import Dictionary
from .errors import Convs2sError
from .generate import generate
from .special_tokens import BOS_SYMBOL, EOS_SYMBOL, PAD_SYMBOL, UNK, UNK_SYMBOL

SPECIAL_WORDS = (BOS_SYMBOL, PAD_SYMBOL, EOS_SYMBOL)  # in input text: words, read as <unk>


class InputError(Convs2sError):
    """Text input (a line, the unknown-word dictionary) that cannot be translated, with where it is."""


def read_lines(path: Optional[str]) -> Iterator[Tuple[int, str]]:
    """(1-based line number, text without newline); '-' or None reads stdin; .gz files are unzipped."""
    if path not in (None, "-"):
        from .data import DataError, iter_lines

        try:
            yield from iter_lines(path)
        except DataError as exc:
            raise InputError(str(exc)) from None
        return
    for lineno, raw in enumerate(sys.stdin.buffer, 1):
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InputError(f"<stdin>:{lineno}: invalid UTF-8 ({exc.reason} at byte {exc.start})") from None
        yield lineno, text.rstrip("\r\n")


def load_align_dict(path: str) -> Dict[str, str]:
    """Plain-text word pairs ``source target``, one per line (the paper's unknown-word dictionary)."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"unknown-word dictionary not found: {p}")
    pairs = {}
    with open(p, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            parts = line.split()
            if not parts:
                continue
            if len(parts) != 2:
                raise InputError(f"{p}:{lineno}: expected 'source_word target_word', got {line.strip()!r}")
            pairs[parts[0]] = parts[1]
    return pairs


def replace_unk(hypo_words: Sequence[str], src_words: Sequence[str], alignment: Sequence[int],
                align_dict: Dict[str, str]) -> List[str]:
    """Replace each ``<unk>`` by the dictionary translation of its most-attended source word,
    or by that word itself when the dictionary has none (paper section 4.3)."""
    src = list(src_words) + ["<eos>"]
    out = []
    for i, w in enumerate(hypo_words):
        if w == UNK_SYMBOL:
            s = src[int(alignment[i])]
            w = align_dict.get(s, s)
        out.append(w)
    return out


class Tokenizer:
    """Text to the model's pieces and back: sentencepiece when a model file is given; otherwise
    whitespace tokens, first Moses-tokenised (``moses=(source_lang, target_lang)``, sacremoses) and
    split by subword-nmt BPE codes (``bpe_codes``) where given, as fairseq's released models were
    trained. ``remove_bpe`` is the continuation marker taken out of the output ("@@ " with codes)."""

    def __init__(self, spm_model: Optional[str] = None, remove_bpe: Optional[str] = None, *,
                 bpe_codes: Optional[str] = None, moses: Optional[Tuple[str, str]] = None):
        self.sp = self.bpe = self.moses = None
        self.remove_bpe = remove_bpe if remove_bpe is not None or bpe_codes is None else "@@ "
        if spm_model is not None:
            if not Path(spm_model).is_file():
                raise FileNotFoundError(f"sentencepiece model not found: {spm_model}")
            import sentencepiece as spm

            self.sp = spm.SentencePieceProcessor(model_file=str(spm_model))
        if bpe_codes is not None:
            apply_bpe = _optional("subword_nmt.apply_bpe", "subword-nmt", "BPE codes")
            with open(bpe_codes, encoding="utf-8") as f:
                self.bpe = apply_bpe.BPE(f, separator=self.remove_bpe.rstrip())
        if moses is not None:
            sacremoses = _optional("sacremoses", "sacremoses", "the Moses tokeniser")
            self.moses = sacremoses.MosesTokenizer(lang=moses[0]), sacremoses.MosesDetokenizer(lang=moses[1])

    def encode(self, text: str) -> List[str]:
        if self.sp is not None:
            return self.sp.encode(text, out_type=str)
        if self.moses is not None:
            text = self.moses[0].tokenize(text, return_str=True, escape=False)
        if self.bpe is not None:
            text = self.bpe.process_line(text)
        return text.split()

    def decode(self, pieces: Sequence[str]) -> str:
        if self.sp is not None:
            return self.sp.decode(list(pieces))
        text = " ".join(pieces)
        if self.remove_bpe:
            text = (text + " ").replace(self.remove_bpe, "").rstrip()
        if self.moses is not None:
            text = self.moses[1].detokenize(text.split())
        return text


def _optional(module: str, package: str, what: str):
    """An optional dependency, or one line saying how to install it."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        raise Convs2sError(f"{what} need the {package} package: pip install {package}") from None


@dataclass
class Translation:
    lineno: int
    source: str
    source_tokens: List[str]
    hypotheses: List[dict]  # each with "text", "tokens", "score", "positional_scores", ["alignment"]
    note: Optional[str] = None
    truncated: bool = False  # longer than the model's positions: its first tokens translated


def translate_lines(model, src_dict: Dictionary, tgt_dict: Dictionary, lines: Iterator[Tuple[int, str]],
                    tokenizer: Tokenizer, *, chunk_size: int = 512, align_dict: Optional[Dict[str, str]] = None,
                    need_alignment: bool = False, **gen_kwargs) -> Iterator[Translation]:
    """Yield translations in input order, ``chunk_size`` lines at a time.

    An empty line yields an empty translation (with a note); a line longer than the model's
    positions is truncated to fit (with a note naming the line)."""
    max_src = min(model.max_positions()) - 1  # room for EOS
    need_attn = need_alignment or align_dict is not None
    chunk: List[Tuple[int, str, List[str]]] = []

    def flush():
        notes: Dict[int, str] = {}
        truncated = set()
        todo = []
        for lineno, text, toks in chunk:
            if not toks:
                notes[lineno] = f"line {lineno} is empty: wrote an empty translation"
            elif len(toks) > max_src:
                notes[lineno] = f"line {lineno} has {len(toks)} tokens; truncated to the model's {max_src}"
                toks[:] = toks[:max_src]
                truncated.add(lineno)
            special = sorted({t for t in toks if t in SPECIAL_WORDS})
            if special:  # as text they are words, not the model's padding or end of sentence
                said = f"{', '.join(special)} read as {UNK_SYMBOL}"
                notes[lineno] = f"{notes[lineno]}; {said}" if lineno in notes else f"line {lineno}: {said}"
            if toks:
                todo.append([UNK if t in SPECIAL_WORDS else i for t, i in zip(toks, src_dict.encode(toks))])
        results = iter(generate(model, todo, return_attention=need_attn, **gen_kwargs)) if todo else iter(())
        for lineno, text, toks in chunk:
            hyps = []
            if toks:
                for h in next(results):
                    words = [tgt_dict[int(t)] for t in h["tokens"][:-1]]
                    if align_dict is not None:
                        words = replace_unk(words, toks, h["alignment"].tolist(), align_dict)
                    hyps.append(dict(h, words=words, text=tokenizer.decode(words)))
            yield Translation(lineno, text, toks, hyps, notes.get(lineno), lineno in truncated)
        chunk.clear()

    lines = iter(lines)
    while True:
        try:
            lineno, text = next(lines)
        except StopIteration:
            break
        except InputError:
            yield from flush()  # translate what was read before the bad line, then report it
            raise
        chunk.append((lineno, text, tokenizer.encode(text)))
        if len(chunk) >= chunk_size:
            yield from flush()
    if chunk:
        yield from flush()


def format_fairseq_lines(i: int, tr: Translation, print_alignment: bool) -> List[str]:
    """fairseq-generate's S-/H-/P-/A- lines; scores in base 2 as fairseq prints them."""
    out = [f"S-{i}\t{tr.source}"]
    for h in tr.hypotheses:
        out.append(f"H-{i}\t{h['score'] / math.log(2):.6f}\t{h['text']}")
        out.append(f"P-{i}\t" + " ".join(f"{s / math.log(2):.4f}" for s in h["positional_scores"].tolist()))
        if print_alignment and "alignment" in h:
            out.append(f"A-{i}\t" + " ".join(str(int(a)) for a in h["alignment"].tolist()))
    return out


def write_lines(stream: TextIO, lines: Sequence[str]) -> None:
    for line in lines:
        stream.write(line + "\n")
    stream.flush()
