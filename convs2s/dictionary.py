"""fairseq-format dictionaries: four implicit specials, then one ``symbol count`` per line."""

from __future__ import annotations

import itertools
import os
from pathlib import Path
from typing import Dict, Iterable, List, Sequence, Union

from .atomic import atomic_write_text
from .errors import Convs2sError
from .special_tokens import BOS, EOS, NUM_SPECIALS, PAD, SYMBOLS, UNK


class DictionaryFormatError(Convs2sError):
    """A dictionary file that is not fairseq's ``symbol count`` lines, with the file and line."""


class Dictionary:
    """Symbol <-> index map with fairseq's specials ``<s>``=0, ``<pad>``=1, ``</s>``=2, ``<unk>``=3."""

    def __init__(self, symbols: Iterable[str] = (), counts: Iterable[int] = ()):
        self.symbols: List[str] = list(SYMBOLS)
        self.counts: List[int] = [1] * NUM_SPECIALS
        self.indices: Dict[str, int] = {s: i for i, s in enumerate(SYMBOLS)}
        counts = list(counts)
        for sym, cnt in zip(symbols, counts or itertools.repeat(1)):
            self.add_symbol(sym, cnt)

    def __len__(self) -> int:
        return len(self.symbols)

    def __getitem__(self, idx: int) -> str:
        return self.symbols[idx]

    def index(self, symbol: str) -> int:
        return self.indices.get(symbol, UNK)

    def add_symbol(self, symbol: str, count: int = 1, overwrite: bool = False) -> int:
        if symbol in self.indices and not overwrite:
            idx = self.indices[symbol]
            self.counts[idx] += count
            return idx
        self.indices[symbol] = len(self.symbols)
        self.symbols.append(symbol)
        self.counts.append(count)
        return len(self.symbols) - 1

    def encode(self, tokens: Sequence[str]) -> List[int]:
        """Token strings -> ids (unknown words -> ``<unk>``), without EOS."""
        return [self.index(t) for t in tokens]

    def string(self, ids: Iterable[int]) -> str:
        """Ids -> space-joined symbols, dropping BOS/EOS/pad (fairseq's ``Dictionary.string``)."""
        return " ".join(self.symbols[int(i)] for i in ids if int(i) not in (BOS, PAD, EOS))

    @classmethod
    def load(cls, path: Union[str, os.PathLike]) -> "Dictionary":
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"dictionary file not found: {path}")
        d = cls()
        with open(path, encoding="utf-8") as f:
            for lineno, raw in enumerate(f, 1):
                line = raw.rstrip("\n")
                if not line.strip():
                    continue
                overwrite = False
                if line.endswith(" #fairseq:overwrite"):
                    overwrite, line = True, line[: -len(" #fairseq:overwrite")]
                sym, sep, cnt = line.rpartition(" ")
                if not sep or not sym or not cnt.lstrip("-").isdigit():
                    raise DictionaryFormatError(f"{path}:{lineno}: expected '<symbol> <count>', got {raw.rstrip()!r}")
                if sym in d.indices and not overwrite:
                    raise DictionaryFormatError(
                        f"{path}:{lineno}: duplicate symbol {sym!r} (fairseq needs '#fairseq:overwrite' for that)"
                    )
                d.add_symbol(sym, int(cnt), overwrite=overwrite)
        return d

    def save(self, path: Union[str, os.PathLike]) -> None:
        """Write atomically: an interrupted save leaves the previous file as it was."""
        words = zip(self.symbols[NUM_SPECIALS:], self.counts[NUM_SPECIALS:])
        atomic_write_text(path, "".join(f"{sym} {cnt}\n" for sym, cnt in words))
