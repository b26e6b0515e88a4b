"""Text in, text out, from Python: :class:`Translator` (the command line's ``translate`` and
``generate`` are a shell over it).

    >>> tr = convs2s.Translator("wmt14.en-fr.fconv-py/model.pt", tokenizer="moses")  # bpecodes beside it
    >>> tr.translate("The house is blue.")
    "La maison est bleue."

It loads a fairseq ``fconv`` checkpoint with its dictionaries and its text pieces (a
sentencepiece ``spm.model``, as ``convs2s train`` writes beside its checkpoints, or subword-nmt
``bpecodes``, as fairseq's released models have, found beside the checkpoint or given), and
prepares the decoding engine once, on the command line's fast path: the compute type ``auto``
measured on this machine for this model (cached), folded attention (the same n-best lists in
fewer FLOPs).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator, List, Optional, Sequence, Tuple, Union

from . import checks
from .errors import Convs2sError

SPM_FILE = "spm.model"  # what `convs2s train` writes beside its checkpoints
BPE_CODES_FILE = "bpecodes"  # what fairseq's released models ship beside model.pt


@dataclass
class Hypothesis:
    """One translation of a source: its ``text``, ``score`` (log-probability over its length, as
    fairseq's ``H-`` lines before their base-2 change), the target ``words`` (pieces, before
    detokenising), ``positional_scores`` per target token (EOS last) and, when asked, the
    ``alignment``: the most-attended source position of each target token."""

    text: str
    score: float
    words: List[str]
    positional_scores: List[float]
    alignment: Optional[List[int]] = None


class Translator:
    """A fairseq ``fconv`` checkpoint ready to translate text, on the command line's defaults.

    ``compute_type``: ``auto`` (fp32 or bf16, whichever was measured faster for this model on this
    machine at beam ``beam``; cached), ``fp32``, ``bf16``, ``int8`` (the fastest int8 variant, a
    small quality cost) or a variant name. ``threads``: torch's threads (None: as they are).
    ``backend``: the kernel backend (None: ``auto``). ``fold_attention``: fold the attention
    projections into the encoder outputs (the same n-best lists, faster steps). ``spm`` /
    ``bpe_codes``: the text pieces (default: ``spm.model`` or ``bpecodes`` beside the checkpoint);
    ``tokenizer="moses"`` Moses-tokenises around BPE codes (fairseq's released models);
    ``remove_bpe``: the BPE marker to remove from output of an already split input. ``shortlist``:
    a file of candidate target words per source word (``src tgt1 tgt2 ...``), scored with the
    ``shortlist_top`` most frequent words instead of the whole vocabulary.
    """

    def __init__(self, checkpoint, *, compute_type: str = "auto", threads: Optional[int] = None,
                 backend: Optional[str] = None, fold_attention: bool = True, dicts=None, spm=None, bpe_codes=None,
                 tokenizer: Optional[str] = None, remove_bpe: Optional[str] = None, device: str = "cpu",
                 beam: int = 5, remeasure: bool = False, trust_pickle: bool = False, verbose: bool = False,
                 shortlist=None, shortlist_top: int = 100):
        self._arguments = {k: v for k, v in locals().items() if k != "self"}  # to build it again (a corpus job)
        spm, bpe_codes = _pieces_files(checkpoint, dicts, spm, bpe_codes)
        self.files = dict(checkpoint=str(checkpoint), spm=spm, bpe_codes=bpe_codes,
                          shortlist=None if shortlist is None else str(shortlist))  # what shapes the output
        if tokenizer not in (None, "moses"):
            raise Convs2sError(f"tokenizer must be None or 'moses', got {tokenizer!r}")
        import torch

        from .compute_type import DECODE_ENV, apply_variant, choose_decoding
        from .fairseq_io import load_fairseq_with_languages
        from .translate import Tokenizer

        if threads:
            torch.set_num_threads(threads)
        model, self.src_dict, self.tgt_dict, langs = load_fairseq_with_languages(checkpoint, dicts,
                                                                                trust_pickle=trust_pickle)
        model.use_backend(backend)
        model.to(device)
        self.choice = choose_decoding(model, compute_type, beam=beam, fold_attention=fold_attention,
                                      remeasure=remeasure)
        if verbose and (self.choice.seconds or self.choice.why.startswith(DECODE_ENV)):
            print(self.choice.line("compute type"), file=sys.stderr)  # measured, cached, or the override
        apply_variant(model, self.choice.name)
        self.model, self.fold_attention = model, fold_attention
        self.options = dict(backend=backend, fold_attention=fold_attention, tokenizer=tokenizer,
                            remove_bpe=remove_bpe, shortlist_top=shortlist_top)  # a journal's key, with files
        moses = (langs[0] or "en", langs[1] or "en") if tokenizer == "moses" else None
        self.tokenizer = Tokenizer(spm, remove_bpe, bpe_codes=bpe_codes, moses=moses)
        self.shortlist = None
        if shortlist is not None:  # vocabulary selection: the target words scored per batch
            from .shortlist import Shortlist

            self.shortlist = Shortlist.from_file(shortlist, self.src_dict, self.tgt_dict, shortlist_top)

    @property
    def compute_type(self) -> str:
        """The variant decoding runs in (``auto`` resolved)."""
        return self.choice.name

    def translate(self, texts: Union[str, Sequence[str]], *, beam: int = 5, nbest: int = 1,
                  return_hypotheses: bool = False, return_alignment: bool = False, **search):
        """Translations of ``texts`` in order: each a string (``nbest`` > 1: a list of ``nbest``
        strings), or with ``return_hypotheses`` a list of :class:`Hypothesis`. One string in,
        one result out. ``search``: :class:`convs2s.SearchOptions`' other fields (``lenpen``,
        ``max_len_a``, ``max_len_b``, ``min_len``, ``unkpen``, ``batch_size``, ...)."""
        one = isinstance(texts, str)
        lines = [texts] if one else list(texts)
        if any(not isinstance(t, str) for t in lines):
            raise TypeError("texts must be a string or a sequence of strings")
        results = []
        for tr in self.translate_lines(enumerate(lines, 1), beam=beam, nbest=nbest, chunk_size=max(1, len(lines)),
                                       need_alignment=return_alignment, **search):
            hyps = [_hypothesis(h, return_alignment) for h in tr.hypotheses] or \
                [Hypothesis("", float("-inf"), [], [])]  # an empty line: an empty translation
            results.append(hyps if return_hypotheses else hyps[0].text if nbest == 1 else [h.text for h in hyps])
        return results[0] if one else results

    def translate_lines(self, lines: Iterable[Tuple[int, str]], *, chunk_size: int = 512, align_dict=None,
                        need_alignment: bool = False, **search) -> Iterator:
        """:class:`convs2s.translate.Translation` of each ``(line number, text)`` in order,
        ``chunk_size`` lines decoded at a time (the command line's loop; ``search`` as in
        :meth:`translate`)."""
        from .translate import translate_lines

        search.setdefault("fold_attention", self.fold_attention)
        if self.shortlist is not None:
            search.setdefault("shortlist", self.shortlist)
        return translate_lines(self.model, self.src_dict, self.tgt_dict, iter(lines), self.tokenizer,
                               chunk_size=chunk_size, align_dict=align_dict, need_alignment=need_alignment, **search)

    def translate_file(self, source, output, *, chunk_size: int = 512, progress: bool = False,
                       distributed: Optional[bool] = None, **search) -> Optional[int]:
        """Translate the lines of ``source`` (a path, ``-`` for stdin) into ``output`` (a path or a
        text stream), one line each, a chunk of ``chunk_size`` lines at a time: the command line's
        ``translate`` (:mod:`convs2s.corpus`). Into a path it is journalled (``<output>.journal``:
        called again after an interruption it continues from the finished chunks; another job's
        journal is refused). ``distributed`` (None: when launched by ``torchrun`` and no process
        group is formed yet): every process of the torchrun calls it, the group shares the chunks
        and the process that can read ``source`` writes. Returns how many lines were longer than
        the model's positions (translated from their first tokens; each named on stderr); None on
        the group's processes that do not write."""
        import torch.distributed as dist

        from . import corpus
        from .distributed import launched_by_torchrun
        from .translate import write_lines

        group = (launched_by_torchrun() and not dist.is_initialized()) if distributed is None else distributed
        if group and not launched_by_torchrun():
            raise Convs2sError("distributed=True needs a process launched by torchrun")
        stream = output if hasattr(output, "write") else None
        if corpus.checked_here(str(source), group):
            checks.text_file(source, what="input file")
            if stream is None:
                checks.writable_file(output)

        def consume(tr):  # into a path, convs2s.corpus writes the file itself
            if stream is not None:
                write_lines(stream, [h["text"] for h in tr.hypotheses[:1]] or [""])

        key = dict(self.options, **{k: _key_value(v) for k, v in search.items()})
        job = corpus.Job(self._as_writer_chose, str(source), chunk_size, consume, key,
                         output=None if stream is not None else str(output), search=search, progress=progress,
                         report=progress, group=group)
        return corpus.run(job)

    def _as_writer_chose(self, compute_type: Optional[str]) -> "Translator":
        """This translator for a corpus job whose writer decodes in ``compute_type`` (None: as chosen
        here); built again in the writer's choice where this process measured another."""
        if compute_type in (None, self.compute_type):
            return self
        return Translator(**dict(self._arguments, compute_type=compute_type, verbose=False))


def _key_value(value):
    """A search option as a journal's key holds it: a scalar as it is, a table by its digest."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, dict):
        import hashlib
        import json

        return hashlib.sha256(json.dumps(sorted(value.items()), default=str).encode()).hexdigest()
    return type(value).__name__


def _pieces_files(checkpoint, dicts, spm, bpe_codes) -> Tuple[Optional[str], Optional[str]]:
    """The checkpoint checked, and its sentencepiece model or BPE codes: as given, else the one
    beside the checkpoint (or its dictionaries)."""
    checks.existing_file(checkpoint, what="checkpoint")
    if spm is not None and bpe_codes is not None:
        raise Convs2sError("give a sentencepiece model or BPE codes, not both")
    for path, what in ((spm, "sentencepiece model"), (bpe_codes, "BPE codes file")):
        if path is not None:
            checks.existing_file(path, what=what)
    if spm is None and bpe_codes is None:
        for folder in dict.fromkeys(Path(f) for f in (Path(checkpoint).parent, dicts) if f is not None):
            if (folder / SPM_FILE).is_file():
                return str(folder / SPM_FILE), None
            if (folder / BPE_CODES_FILE).is_file():
                return None, str(folder / BPE_CODES_FILE)
    return (None if spm is None else str(spm)), (None if bpe_codes is None else str(bpe_codes))


def _hypothesis(h: dict, alignment: bool) -> Hypothesis:
    return Hypothesis(h["text"], float(h["score"]), list(h["words"]), h["positional_scores"].tolist(),
                      h["alignment"].tolist() if alignment and "alignment" in h else None)
