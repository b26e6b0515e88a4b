"""What the speed table translates: the paper's newstest2012+2013 set (6003 sentences) in the unit
the paper's model read, and the configurations it times.

The paper's WMT'14 En-Fr model read BPE subwords (Moses tokens, a joint En+Fr BPE of 40K
merges), not words. ``NEWSTEST_SUBWORD_LENGTHS`` is the length histogram of the 6003 English
sources in such subwords, measured by ``bench/tools/measure_subword_lengths.py`` (the sources'
Moses tokens, lowercased, through a joint En+Fr BPE of 40,000 merges learned by subword-nmt on
wordfreq's large En and Fr frequency lists: we have no WMT training corpus, so the merges come
from general-domain counts of both languages; the result and its settings are in
``bench/results/newstest-subword-lengths.json``): mean 25.40 subwords against 22.95 words
(1.107 subwords per word), maximum 205. Outputs are forced to ``round(1.1 x source)`` subwords,
the French/English subword ratio the same BPE gives on Multi30k's parallel test set (1.11).
"""

from __future__ import annotations

import random
import zlib
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence

import torch

# Whitespace-word lengths of the English newstest2012 + newstest2013 sources (mean 22.95, max 137);
# a test checks them against the files in ../shared.
NEWSTEST_LENGTHS: Dict[int, int] = {
    1: 15, 2: 37, 3: 37, 4: 47, 5: 83, 6: 112, 7: 130, 8: 158, 9: 187, 10: 169, 11: 184, 12: 196, 13: 191,
    14: 198, 15: 211, 16: 225, 17: 215, 18: 224, 19: 207, 20: 212, 21: 195, 22: 187, 23: 165, 24: 166,
    25: 170, 26: 163, 27: 126, 28: 126, 29: 120, 30: 121, 31: 106, 32: 99, 33: 111, 34: 91, 35: 69, 36: 84,
    37: 72, 38: 59, 39: 47, 40: 72, 41: 48, 42: 32, 43: 44, 44: 46, 45: 41, 46: 36, 47: 34, 48: 31, 49: 34,
    50: 23, 51: 31, 52: 21, 53: 16, 54: 18, 55: 14, 56: 12, 57: 8, 58: 13, 59: 11, 60: 14, 61: 5, 62: 10,
    63: 7, 64: 7, 65: 2, 66: 3, 67: 3, 68: 5, 69: 2, 70: 3, 71: 2, 72: 5, 73: 5, 74: 3, 75: 1, 76: 4, 77: 2,
    78: 3, 79: 2, 80: 3, 82: 1, 84: 1, 85: 1, 86: 1, 87: 1, 88: 1, 91: 1, 92: 2, 106: 1, 125: 1, 137: 1,
}

# The same sentences' lengths in BPE subwords (see the module docstring): mean 25.40, max 205.
NEWSTEST_SUBWORD_LENGTHS: Dict[int, int] = {
    1: 11, 2: 26, 3: 34, 4: 32, 5: 70, 6: 99, 7: 116, 8: 127, 9: 147, 10: 148, 11: 179, 12: 171, 13: 172, 14: 174,
    15: 187, 16: 185, 17: 200, 18: 192, 19: 177, 20: 197, 21: 185, 22: 198, 23: 165, 24: 153, 25: 149, 26: 164,
    27: 173, 28: 149, 29: 125, 30: 115, 31: 122, 32: 86, 33: 102, 34: 111, 35: 81, 36: 99, 37: 87, 38: 74, 39: 76,
    40: 72, 41: 66, 42: 49, 43: 47, 44: 52, 45: 45, 46: 39, 47: 47, 48: 35, 49: 46, 50: 32, 51: 35, 52: 32, 53: 30,
    54: 33, 55: 28, 56: 23, 57: 15, 58: 17, 59: 19, 60: 17, 61: 9, 62: 12, 63: 10, 64: 14, 65: 11, 66: 10, 67: 12,
    68: 10, 69: 6, 70: 3, 71: 2, 72: 8, 73: 4, 74: 1, 75: 2, 76: 3, 77: 4, 78: 3, 79: 3, 80: 3, 81: 2, 82: 2, 83: 5,
    84: 3, 85: 2, 86: 2, 87: 4, 88: 2, 91: 3, 92: 2, 95: 1, 99: 1, 100: 1, 101: 1, 102: 1, 111: 1, 113: 1, 151: 1,
    205: 1,
}
SUBWORDS_PER_WORD = 1.107
TARGET_RATIO = 1.1  # forced output subwords per source subword (French/English, measured 1.11)
LENGTH_NOTE = ("newstest2012+2013 (the paper's 6003 sentences), synthetic: the English sources' lengths in BPE "
               f"subwords (Moses tokens + a joint En+Fr BPE of 40K merges; mean 25.4, {SUBWORDS_PER_WORD} per word), "
               f"outputs forced to round({TARGET_RATIO} x source) subwords")

# Table 3 of the paper: (system, BLEU, seconds for the 6003 sentences, beam or None for GNMT).
PAPER_ROWS = [
    ("GNMT GPU (K80)", 31.20, 3028, None), ("GNMT CPU 88 cores", 31.20, 1322, None), ("GNMT TPU", 31.21, 384, None),
    ("ConvS2S GPU (K40) b=1", 33.45, 327, 1), ("ConvS2S GPU (M40) b=1", 33.45, 221, 1),
    ("ConvS2S GPU (GTX-1080ti) b=1", 33.45, 142, 1), ("ConvS2S CPU 48 cores b=1", 33.45, 142, 1),
    ("ConvS2S GPU (K40) b=5", 34.10, 587, 5), ("ConvS2S CPU 48 cores b=5", 34.10, 482, 5),
    ("ConvS2S GPU (M40) b=5", 34.10, 406, 5), ("ConvS2S GPU (GTX-1080ti) b=5", 34.10, 256, 5),
]
PAPER_SENTENCES = 6003
SUBSET_SEED = 2017  # the fixed shuffled order --sentences N cuts its subset from

# the dtypes a configuration can name: convs2s.compute_type's variants of the same names (int8:
# int8 decoder weights and activations; int8w: weights only; int7: 7-bit activations; w7a7: 7-bit
# weights too); each int8 one held against the int8 GEMM peak of its widths, int8w (float32 math)
# against the float32 one
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "int8": torch.float32, "int8w": torch.float32,
          "int7": torch.float32, "w7a7": torch.float32}
PEAK_OF = {"fp32": "fp32", "bf16": "bf16", "int8": "int8", "int8w": "fp32", "int7": "int7", "w7a7": "w7a7"}
DECODERS = ("plain", "folded")  # folded: attention projections precomputed per sentence (exact)


@dataclass(frozen=True)
class Config:
    """One timed configuration: which backend runs the ops, which decoder, which dtype."""

    backend: str
    decoder: str
    dtype: str

    @property
    def name(self) -> str:
        return f"{self.backend} {self.decoder} {self.dtype}"


REFERENCE = Config("reference", "plain", "fp32")


def auto_config(device: torch.device, available: Dict[str, Optional[str]]) -> Config:
    """The configuration ``auto`` stands for before its dtype is measured: the native backend
    (triton on CUDA, cpp on the CPU, where they load) with the folded decoder; the dtype ``auto``
    is resolved on the model at hand by :func:`convs2s.compute_type.choose_decoding` (fp32 or
    bf16, timed; int8 changes the model's numbers and is asked for with ``--dtype int8``)."""
    if device.type == "cuda":
        return Config("triton" if available.get("triton") is None else "reference", "folded", "auto")
    return Config("cpp" if available.get("cpp") is None else "reference", "folded", "auto")


def synthetic_lengths(histogram: Dict[int, int] = NEWSTEST_SUBWORD_LENGTHS) -> List[int]:
    """The 6003 newstest source lengths (subwords by default), in a fixed shuffled order."""
    lengths = [L for L, n in sorted(histogram.items()) for _ in range(n)]
    random.Random(SUBSET_SEED).shuffle(lengths)
    return lengths


def subset_order(n_total: int) -> List[int]:
    order = list(range(n_total))
    random.Random(SUBSET_SEED).shuffle(order)
    return order


def hashed_ids(tokens: Sequence[str], vocab: int) -> List[int]:
    """Stable ids in [4, vocab) for words, for random-weight runs on a real text."""
    return [4 + zlib.crc32(t.encode("utf-8")) % (vocab - 4) for t in tokens]


def random_sentences(lengths: Sequence[int], vocab: int, seed: int) -> List[List[int]]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(4, vocab, (L,), generator=gen).tolist() for L in lengths]


def forced_lengths(sources: Sequence[Sequence[int]]) -> List[int]:
    return [max(1, round(TARGET_RATIO * len(s))) for s in sources]
