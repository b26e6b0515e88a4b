"""Parallel corpora: reading, cleaning, joint BPE, binarised datasets and token-budget batches.

The flow mirrors ``fairseq-preprocess`` + ``fairseq-train``'s data side:

1. :func:`read_parallel` reads two aligned text files (plain or gzipped, strict UTF-8) and checks
   that their line counts match;
2. :func:`clean_pairs` drops empty pairs, pairs over ``max_len`` words and pairs whose length ratio
   exceeds ``max_ratio`` (the paper's 175 words / 1.5), and reports how many of each;
3. :func:`train_joint_bpe` learns one sentencepiece BPE model on both sides;
4. :func:`build_dictionary` counts pieces into a fairseq :class:`~convs2s.dictionary.Dictionary`;
5. :class:`TokenDataset` holds the id sequences (EOS appended) as flat tensors + offsets;
6. :func:`batch_by_tokens` packs length-sorted examples into batches under a padded token budget
   and :func:`collate` builds fairseq's tensors (left-padded sources, EOS-shifted decoder inputs).

:func:`prepare` runs steps 1-5 for a train and a valid split and writes a data folder that
``convs2s train`` reads.
"""

from __future__ import annotations

import gzip
import json
import math
import os
import random
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Sequence, Tuple, Union

import torch

from .atomic import atomic_torch_save, atomic_write_text
from .dictionary import Dictionary
from .errors import Convs2sError
from .special_tokens import EOS, PAD, UNK

PathLike = Union[str, os.PathLike]


class DataError(Convs2sError):
    """A corpus or data folder that cannot be used, with the reason."""


# --- reading ---------------------------------------------------------------------------------
def iter_lines(path: PathLike) -> Iterator[Tuple[int, str]]:
    """(1-based line number, text without the newline) of a UTF-8 file, gzipped if it ends in .gz."""
    p = Path(path)
    if not p.exists() or p.is_dir():
        raise FileNotFoundError(f"input file not found: {p}")
    try:
        stream = gzip.open(p, "rb") if p.suffix == ".gz" else open(p, "rb")
    except OSError as exc:
        raise DataError(f"cannot read {p}: {exc.strerror or exc}") from None
    with stream:
        lineno = 0
        try:
            for lineno, raw in enumerate(stream, 1):
                try:
                    text = raw.decode("utf-8")
                except UnicodeDecodeError as exc:
                    raise DataError(f"{p}:{lineno}: invalid UTF-8 ({exc.reason} at byte {exc.start})") from None
                yield lineno, text.rstrip("\r\n")
        except (OSError, EOFError) as exc:  # gzip.BadGzipFile is an OSError; truncated streams raise EOFError
            raise DataError(f"cannot read {p} after line {lineno}: {exc}") from None


def resolve_corpus_file(prefix: PathLike, lang: str) -> Path:
    """``{prefix}.{lang}``, or ``{prefix}.{lang}.gz`` when only the gzipped file exists."""
    plain = Path(f"{prefix}.{lang}")
    gz = Path(f"{prefix}.{lang}.gz")
    if plain.is_file():
        return plain
    if gz.is_file():
        return gz
    raise FileNotFoundError(f"no corpus file for language {lang!r}: neither {plain} nor {gz} exists")


def read_parallel(src_path: PathLike, tgt_path: PathLike) -> List[Tuple[str, str]]:
    """Aligned (source, target) lines; a line-count mismatch names both files and counts."""
    src = [t for _, t in iter_lines(src_path)]
    tgt = [t for _, t in iter_lines(tgt_path)]
    if len(src) != len(tgt):
        raise DataError(
            f"parallel files differ in length: {src_path} has {len(src)} lines, {tgt_path} has {len(tgt)}"
        )
    if not src:
        raise DataError(f"the corpus {src_path} / {tgt_path} is empty")
    return list(zip(src, tgt))


@dataclass
class CleanReport:
    kept: int = 0
    empty: int = 0
    too_long: int = 0
    bad_ratio: int = 0

    def __str__(self) -> str:
        return (f"kept {self.kept} pairs; dropped {self.empty} empty, {self.too_long} over the length limit, "
                f"{self.bad_ratio} over the length ratio")


def clean_pairs(pairs: Sequence[Tuple[str, str]], max_len: Optional[int] = 175,
                max_ratio: Optional[float] = 1.5) -> Tuple[List[Tuple[str, str]], CleanReport]:
    """Drop empty pairs, pairs over ``max_len`` words on either side and pairs whose word-count
    ratio exceeds ``max_ratio`` (Moses ``clean-corpus-n`` rules; ``None`` disables a limit)."""
    report = CleanReport()
    kept = []
    for src, tgt in pairs:
        ls, lt = len(src.split()), len(tgt.split())
        if ls == 0 or lt == 0:
            report.empty += 1
        elif max_len is not None and max(ls, lt) > max_len:
            report.too_long += 1
        elif max_ratio is not None and max(ls, lt) > max_ratio * min(ls, lt):
            report.bad_ratio += 1
        else:
            kept.append((src, tgt))
    report.kept = len(kept)
    return kept, report


# --- subwords and dictionaries ------------------------------------------------------------------
def train_joint_bpe(texts: Sequence[str], model_prefix: PathLike, vocab_size: int, *,
                    max_sentences: int = 2_000_000, num_threads: int = 2) -> Path:
    """Learn one sentencepiece BPE model on ``texts`` (both languages); returns the .model path."""
    import sentencepiece as spm

    if vocab_size < 8:
        raise DataError(f"BPE vocabulary size must be at least 8, got {vocab_size}")
    if not any(t.strip() for t in texts):
        raise DataError("cannot learn BPE from an empty corpus")
    model_prefix = Path(model_prefix)
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(texts), model_prefix=str(model_prefix), vocab_size=vocab_size,
            model_type="bpe", character_coverage=1.0, input_sentence_size=max_sentences,
            shuffle_input_sentence=False, seed_sentencepiece_size=1_000_000, num_threads=num_threads,
            # fairseq's dictionary adds its own specials; sentencepiece keeps only <unk>.
            unk_id=0, bos_id=-1, eos_id=-1, pad_id=-1, minloglevel=2,
        )
    except RuntimeError as exc:
        msg = str(exc)
        if "Vocabulary size too high" in msg or "vocab_size" in msg:
            raise DataError(f"the corpus cannot support a BPE vocabulary of {vocab_size}: {msg.strip()}; "
                            "choose a smaller --bpe-size") from None
        raise DataError(f"sentencepiece training failed: {msg.strip()}") from None
    return model_prefix.with_suffix(".model")


def build_dictionary(tokenised: Sequence[Sequence[str]], threshold: int = 0) -> Dictionary:
    """fairseq-preprocess's dictionary: specials first, then symbols by decreasing count (ties by name)."""
    counts = Counter(tok for toks in tokenised for tok in toks)
    symbols = sorted((s for s, c in counts.items() if c > threshold), key=lambda s: (-counts[s], s))
    return Dictionary(symbols, [counts[s] for s in symbols])


# --- datasets ---------------------------------------------------------------------------------
class TokenDataset:
    """Source/target id sequences (EOS appended) stored as flat int32 tensors with offsets."""

    def __init__(self, src: Sequence[Sequence[int]], tgt: Sequence[Sequence[int]]):
        if len(src) != len(tgt):
            raise DataError(f"{len(src)} source sequences but {len(tgt)} target sequences")
        self.src_tokens, self.src_offsets = self._flatten(src)
        self.tgt_tokens, self.tgt_offsets = self._flatten(tgt)

    @staticmethod
    def _flatten(seqs):
        lengths = torch.tensor([len(s) + 1 for s in seqs], dtype=torch.int64)
        offsets = torch.zeros(len(seqs) + 1, dtype=torch.int64)
        torch.cumsum(lengths, 0, out=offsets[1:])
        flat = torch.empty(int(offsets[-1]), dtype=torch.int32)
        for i, s in enumerate(seqs):
            flat[offsets[i]:offsets[i + 1] - 1] = torch.as_tensor(list(s), dtype=torch.int32)
            flat[offsets[i + 1] - 1] = EOS
        return flat, offsets

    def __len__(self) -> int:
        return len(self.src_offsets) - 1

    @property
    def src_lengths(self) -> torch.Tensor:
        return self.src_offsets[1:] - self.src_offsets[:-1]

    @property
    def tgt_lengths(self) -> torch.Tensor:
        return self.tgt_offsets[1:] - self.tgt_offsets[:-1]

    def source(self, i: int) -> torch.Tensor:
        return self.src_tokens[self.src_offsets[i]:self.src_offsets[i + 1]]

    def target(self, i: int) -> torch.Tensor:
        return self.tgt_tokens[self.tgt_offsets[i]:self.tgt_offsets[i + 1]]

    def state_dict(self) -> Dict[str, torch.Tensor]:
        return dict(src_tokens=self.src_tokens, src_offsets=self.src_offsets,
                    tgt_tokens=self.tgt_tokens, tgt_offsets=self.tgt_offsets)

    @classmethod
    def from_state_dict(cls, state: Dict[str, torch.Tensor], name: str = "dataset") -> "TokenDataset":
        ds = cls.__new__(cls)
        try:
            ds.src_tokens, ds.src_offsets = state["src_tokens"], state["src_offsets"]
            ds.tgt_tokens, ds.tgt_offsets = state["tgt_tokens"], state["tgt_offsets"]
        except (KeyError, TypeError):
            raise DataError(f"{name} is not a convs2s dataset (expected src/tgt tokens and offsets)") from None
        if len(ds.src_offsets) != len(ds.tgt_offsets) or int(ds.src_offsets[-1]) != len(ds.src_tokens) \
                or int(ds.tgt_offsets[-1]) != len(ds.tgt_tokens):
            raise DataError(f"{name} is inconsistent (offsets disagree with token counts): corrupt file?")
        return ds

    def check_vocab(self, src_vocab: int, tgt_vocab: int, name: str = "dataset") -> None:
        for side, toks, v in (("source", self.src_tokens, src_vocab), ("target", self.tgt_tokens, tgt_vocab)):
            if len(toks) and (int(toks.min()) < 0 or int(toks.max()) >= v):
                raise DataError(f"{name}: {side} ids outside the dictionary of {v} symbols")


# --- batching ---------------------------------------------------------------------------------
def batch_by_tokens(src_lengths: torch.Tensor, tgt_lengths: torch.Tensor, max_tokens: int, *,
                    max_sentences: Optional[int] = None, seed: int = 1, epoch: int = 1,
                    shuffle: bool = True) -> List[List[int]]:
    """Batches of example indices whose padded size ``n * max(len)`` stays within ``max_tokens``.

    As fairseq: examples are sorted by (source, target) length with a random tie order, packed
    greedily (a batch that would exceed the budget is closed and a new one begun), then the batch
    order is shuffled; both random orders depend only on ``(seed, epoch)``.
    """
    n = len(src_lengths)
    longest = torch.maximum(src_lengths, tgt_lengths)
    if n and int(longest.max()) > max_tokens:
        i = int(longest.argmax())
        raise DataError(f"example {i} has {int(longest[i])} tokens, more than --max-tokens {max_tokens}; "
                        "raise --max-tokens or filter long sentences")
    gen = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    order = torch.randperm(n, generator=gen) if shuffle else torch.arange(n)
    # stable sorts: by target length, then by source length, keeping the random order among ties
    order = order[torch.sort(tgt_lengths[order], stable=True).indices]
    order = order[torch.sort(src_lengths[order], stable=True).indices]
    batches: List[List[int]] = []
    current: List[int] = []
    width = 0
    for idx, length in zip(order.tolist(), longest[order].tolist()):
        new_width = max(width, length)
        full = max_sentences is not None and len(current) >= max_sentences
        if current and (new_width * (len(current) + 1) > max_tokens or full):
            batches.append(current)
            current, new_width = [], length
        current.append(idx)
        width = new_width
    if current:
        batches.append(current)
    if shuffle:
        perm = torch.randperm(len(batches), generator=gen).tolist()
        batches = [batches[i] for i in perm]
    return batches


@dataclass
class Batch:
    src_tokens: torch.Tensor  # (B, S) left-padded, ends in EOS
    src_lengths: torch.Tensor  # (B,)
    prev_output_tokens: torch.Tensor  # (B, T) EOS then the target without its EOS, right-padded
    target: torch.Tensor  # (B, T) right-padded, ends in EOS
    ntokens: int  # non-pad target tokens

    def to(self, device) -> "Batch":
        return Batch(self.src_tokens.to(device), self.src_lengths.to(device),
                     self.prev_output_tokens.to(device), self.target.to(device), self.ntokens)


def _gather_padded(flat: torch.Tensor, offsets: torch.Tensor, indices: torch.Tensor, left_pad: bool):
    """Rows ``flat[offsets[i]:offsets[i+1]]`` for ``i`` in ``indices`` in one (B, max_len) tensor."""
    starts, lengths = offsets[indices], offsets[indices + 1] - offsets[indices]
    width = int(lengths.max())
    col = torch.arange(width).unsqueeze(0)
    if left_pad:
        col = col - (width - lengths).unsqueeze(1)  # shift each row right by its padding
    valid = (col >= 0) & (col < lengths.unsqueeze(1))
    pos = (starts.unsqueeze(1) + col).clamp_(0, max(len(flat) - 1, 0))
    return torch.where(valid, flat[pos].long(), torch.full((), PAD, dtype=torch.long)), lengths


def collate(dataset: TokenDataset, indices: Sequence[int]) -> Batch:
    idx = torch.as_tensor(list(indices), dtype=torch.long)
    src, src_lengths = _gather_padded(dataset.src_tokens, dataset.src_offsets, idx, left_pad=True)
    target, tgt_lengths = _gather_padded(dataset.tgt_tokens, dataset.tgt_offsets, idx, left_pad=False)
    # decoder input: EOS, then the target without its final EOS (fairseq's move_eos_to_beginning)
    prev = torch.roll(target, 1, dims=1)
    prev[:, 0] = EOS
    padding = torch.arange(target.shape[1]).unsqueeze(0) >= tgt_lengths.unsqueeze(1)
    prev.masked_fill_(padding, PAD)
    return Batch(src, src_lengths, prev, target, int(tgt_lengths.sum()))


# --- data folders -------------------------------------------------------------------------------
META = "meta.json"


@dataclass
class DataFolder:
    path: Path
    src_lang: str
    tgt_lang: str
    src_dict: Dictionary
    tgt_dict: Dictionary
    meta: dict

    @property
    def spm_model(self) -> Optional[Path]:
        p = self.path / "spm.model"
        return p if p.is_file() else None

    def split_path(self, split: str) -> Path:
        return self.path / f"{split}.{self.src_lang}-{self.tgt_lang}.pt"

    def load_split(self, split: str) -> TokenDataset:
        path = self.split_path(split)
        if not path.is_file():
            raise FileNotFoundError(f"data split {split!r} not found: {path}")
        try:
            state = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as exc:  # noqa: BLE001 - any unreadable file is reported the same way
            raise DataError(f"{path} is not a readable dataset (corrupt or truncated?): {exc}") from None
        ds = TokenDataset.from_state_dict(state, str(path))
        ds.check_vocab(len(self.src_dict), len(self.tgt_dict), str(path))
        return ds


def open_data_folder(path: PathLike) -> DataFolder:
    path = Path(path)
    meta_path = path / META
    if not meta_path.is_file():
        raise FileNotFoundError(f"{path} is not a convs2s data folder (no {META}); create one with "
                                "`convs2s data prepare`")
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
        src, tgt = meta["src_lang"], meta["tgt_lang"]
    except (ValueError, KeyError, TypeError) as exc:
        raise DataError(f"{meta_path} is malformed: {exc}") from None
    return DataFolder(path, src, tgt, Dictionary.load(path / f"dict.{src}.txt"),
                      Dictionary.load(path / f"dict.{tgt}.txt"), meta)


def write_data_folder(out_dir: PathLike, src_lang: str, tgt_lang: str, src_dict: Dictionary, tgt_dict: Dictionary,
                      datasets: Dict[str, TokenDataset], meta: Optional[dict] = None) -> DataFolder:
    """Write dictionaries, ``{split}.{src}-{tgt}.pt`` binaries and ``meta.json`` (last, atomically:
    a folder with a meta.json is complete)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / META).unlink(missing_ok=True)  # incomplete until the new one is written
    for stale in out.glob(f"*.{src_lang}-{tgt_lang}.pt"):  # a split an earlier run wrote and this one does not
        if stale.name[: -len(f".{src_lang}-{tgt_lang}.pt")] not in datasets:
            stale.unlink()
    src_dict.save(out / f"dict.{src_lang}.txt")
    tgt_dict.save(out / f"dict.{tgt_lang}.txt")
    stats = {}
    for name, ds in datasets.items():
        ds.check_vocab(len(src_dict), len(tgt_dict), name)
        atomic_torch_save(ds.state_dict(), out / f"{name}.{src_lang}-{tgt_lang}.pt")
        stats[name] = dict(pairs=len(ds), src_tokens=int(ds.src_lengths.sum()), tgt_tokens=int(ds.tgt_lengths.sum()),
                           tgt_unk=int((ds.tgt_tokens == UNK).sum()))
    meta = dict(meta or {}, src_lang=src_lang, tgt_lang=tgt_lang, stats=stats,
                src_vocab=len(src_dict), tgt_vocab=len(tgt_dict))
    atomic_write_text(out / META, json.dumps(meta, indent=2))
    return open_data_folder(out)


def prepare(out_dir: PathLike, src_lang: str, tgt_lang: str, train_prefix: PathLike,
            valid_prefix: Optional[PathLike] = None, *, bpe_size: int = 8000, max_len: Optional[int] = 175,
            max_ratio: Optional[float] = 1.5, seed: int = 1, log=print) -> DataFolder:
    """Clean, learn joint BPE, build dictionaries and binarise ``train`` (and ``valid``) into ``out_dir``.

    Corpus files are ``{prefix}.{lang}`` or ``{prefix}.{lang}.gz``. Validation pairs are only
    stripped of empty lines (no length filter), so the reported perplexity covers the real set.
    """
    import sentencepiece as spm

    if src_lang == tgt_lang:
        raise DataError(f"source and target languages must differ, got {src_lang!r} twice")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / META).unlink(missing_ok=True)  # an interrupted re-run must not look complete (spm.model is rewritten)
    src_file, tgt_file = resolve_corpus_file(train_prefix, src_lang), resolve_corpus_file(train_prefix, tgt_lang)
    train, report = clean_pairs(read_parallel(src_file, tgt_file), max_len, max_ratio)
    log(f"train {src_file} / {tgt_file}: {report}")
    if not train:
        raise DataError(f"no training pairs left after cleaning {src_file} / {tgt_file} ({report})")
    splits = {"train": train}
    reports = {"train": vars(report)}
    if valid_prefix is not None:
        vs, vt = resolve_corpus_file(valid_prefix, src_lang), resolve_corpus_file(valid_prefix, tgt_lang)
        valid, vreport = clean_pairs(read_parallel(vs, vt), None, None)
        log(f"valid {vs} / {vt}: {vreport}")
        if not valid:
            raise DataError(f"the validation corpus {vs} / {vt} has no non-empty pairs")
        splits["valid"] = valid
        reports["valid"] = vars(vreport)

    texts = [s for s, _ in train] + [t for _, t in train]
    # sentencepiece reads the first max_sentences lines: a seeded shuffle makes that a fair sample
    random.Random(seed).shuffle(texts)
    model_path = train_joint_bpe(texts, out / "spm", bpe_size)
    sp = spm.SentencePieceProcessor(model_file=str(model_path))
    pieces = {name: ([sp.encode(s, out_type=str) for s, _ in pairs], [sp.encode(t, out_type=str) for _, t in pairs])
              for name, pairs in splits.items()}
    src_dict = build_dictionary(pieces["train"][0])
    tgt_dict = build_dictionary(pieces["train"][1])
    datasets = {name: TokenDataset([src_dict.encode(p) for p in sp_src], [tgt_dict.encode(p) for p in sp_tgt])
                for name, (sp_src, sp_tgt) in pieces.items()}
    meta = dict(bpe_size=bpe_size, max_len=max_len, max_ratio=max_ratio, train_files=[str(src_file), str(tgt_file)],
                clean=reports)
    folder = write_data_folder(out, src_lang, tgt_lang, src_dict, tgt_dict, datasets, meta)
    for name, st in folder.meta["stats"].items():
        log(f"{name}: {st['pairs']} pairs, {st['src_tokens']} source / {st['tgt_tokens']} target tokens "
            "(EOS included)")
    log(f"dictionaries: {len(src_dict)} {src_lang} / {len(tgt_dict)} {tgt_lang} symbols; wrote {out}")
    return folder


def perplexity(nll_per_token: float) -> float:
    """exp(nll per token); inf when there is no finite loss yet (or it overflows)."""
    if not math.isfinite(nll_per_token) or nll_per_token > 700.0:
        return math.inf
    return math.exp(nll_per_token)
