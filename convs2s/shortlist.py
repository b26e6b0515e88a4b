"""Vocabulary selection for decoding: score only a shortlist of target words per batch.

The output layer of a 40K-word model is its largest weight (512 x 40000 in ``fconv_wmt_en_fr``);
with a shortlist, each step multiplies by the rows of the candidate words only: the ``top`` most
frequent target words (fairseq dictionaries are sorted by count after the 4 specials) plus the
translations a lexical table lists for every source word of the batch. Words outside the
shortlist get ``-inf``, so the softmax runs over the shortlist.

Shortlist file: one source token per line followed by its candidate target tokens, separated by
whitespace (``Haus house home building``); ``#`` starts a comment line; tokens are the models'
dictionary symbols (BPE units when the model uses them). Tokens unknown to the dictionaries are
skipped and counted.
"""

from __future__ import annotations

import os
from typing import Dict, List, Optional, Sequence, Union

import torch

import convs2s_kernels as ck

from .data import DataError, iter_lines
from .dictionary import Dictionary
from .special_tokens import NUM_SPECIALS  # <s>, <pad>, </s>, <unk>: always candidates


class Shortlist:
    """Candidate target ids per source id, plus ids every batch keeps."""

    def __init__(self, table: Dict[int, Sequence[int]], tgt_vocab_size: int, top: int = 100):
        if top < 0:
            raise DataError(f"the shortlist's top (--shortlist-top) must be >= 0, got {top}")
        self.tgt_vocab_size = tgt_vocab_size
        self.table = {s: torch.as_tensor(sorted(set(t)), dtype=torch.long) for s, t in table.items() if t}
        self.always = torch.arange(min(tgt_vocab_size, NUM_SPECIALS + top))
        self.skipped = 0

    @classmethod
    def from_file(cls, path: Union[str, os.PathLike], src_dict: Dictionary, tgt_dict: Dictionary,
                  top: int = 100) -> "Shortlist":
        table: Dict[int, List[int]] = {}
        skipped = 0
        for lineno, line in iter_lines(path):
            fields = line.split()
            if not fields or fields[0].startswith("#"):
                continue
            if len(fields) < 2:
                raise DataError(f"{path}, line {lineno}: expected a source token and at least one target "
                                f"token, got {line.strip()!r}")
            src = src_dict.indices.get(fields[0])
            tgts = [tgt_dict.indices[t] for t in fields[1:] if t in tgt_dict.indices]
            skipped += (src is None) + len(fields) - 1 - len(tgts)
            if src is not None and tgts:
                table.setdefault(src, []).extend(tgts)
        if not table and top == 0:
            raise DataError(f"{path}: no entry names tokens of the dictionaries, and --shortlist-top is 0")
        shortlist = cls(table, len(tgt_dict), top)
        shortlist.skipped = skipped
        return shortlist

    def candidates(self, src_tokens: torch.Tensor) -> torch.Tensor:
        """Sorted target ids to score for a batch of sources ``(B, S)``."""
        parts = [self.always]
        for s in torch.unique(src_tokens).tolist():
            t = self.table.get(s)
            if t is not None:
                parts.append(t)
        return torch.unique(torch.cat(parts)).to(src_tokens.device)


class VocabSubset:
    """The output layer restricted to ``ids``: its rows gathered once per batch, scattered back
    into full-vocabulary logits (``-inf`` elsewhere) at every step."""

    def __init__(self, fc3: torch.nn.Module, ids: torch.Tensor, derived=None):
        # derived: fc3's convs2s.engine.weights.DerivedWeights (its int8 copy), None for a plain nn.Linear
        self.ids = ids
        self.vocab_size = fc3.out_features
        quantized = None if derived is None else derived.int8_weight()
        self.bias = None if fc3.bias is None else fc3.bias.detach().index_select(0, ids)
        if quantized is not None:
            self.qweight, self.scale = (t.index_select(0, ids) for t in quantized)
            self.int8_product = derived.int8_product()
            # the kernels' layout of the subset (once per batch), where the full weight has one
            self.int8_extra = derived.int8_activation_options()
            if derived.packs_int8(self.qweight):
                self.int8_extra["packed"] = ck.pack_w8a8_weight(self.qweight)
            self.weight = None
        else:
            weight = fc3.effective_weight() if hasattr(fc3, "effective_weight") else fc3.weight
            self.weight = weight.detach().index_select(0, ids)
            self.qweight = self.scale = None

    def logits(self, x: torch.Tensor, backend: Optional[str] = None) -> torch.Tensor:
        if self.qweight is not None:
            small = self.int8_product(x, self.qweight, self.scale, self.bias, backend=backend, **self.int8_extra)
        else:
            small = ck.linear(x, self.weight, self.bias, backend=backend)
        full = small.new_full((*small.shape[:-1], self.vocab_size), float("-inf"))
        full.index_copy_(-1, self.ids, small)
        return full
