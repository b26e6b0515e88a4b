"""Measure newstest2012+2013 source lengths in BPE subword units, as the paper's model reads them.

The speed table (Gehring et al. 2017, Table 3) times translating the 6003 English sentences of
newstest2012+2013. The project models their lengths in whitespace words, but the model reads BPE
subwords: fairseq's WMT'14 En-Fr recipe runs Moses ``tokenizer.perl -a -l en`` and then a joint
En+Fr BPE with 40,000 merges learned by subword-nmt on the WMT training corpus.

We have no WMT corpus here, so this script approximates that BPE:

1. a joint En+Fr word-count dictionary from wordfreq's frequency lists (both languages weighted
   equally, frequencies scaled to integer counts), each word Moses-tokenized like the real text;
2. 40,000 merges learned on it with subword-nmt;
3. each newstest sentence Moses-tokenized, lowercased (wordfreq is lowercase) and BPE-segmented.
   The newstest files here are already Moses-tokenized (``-l en``, without ``-a``) and escaped
   (``&quot;``, ``&apos;s``): their whitespace words are Moses tokens. So by default they are only
   unescaped (an entity is one unit in the real vocabulary), hyphen-split as ``-a`` would, and split
   on whitespace; re-running Moses on them would wrongly split ``'s`` into ``' s``.

It writes the subword-length histogram and ratios (subwords/word, Moses tokens/word), plus the
French/English length ratio on the parallel Multi30k test_2016_flickr set, measured the same way
(the output length the speed table forces is a multiple of the source length). It also checks the
whitespace-word histogram against the project's ``NEWSTEST_LENGTHS`` (``bench/convs2s_bench/``).

    pip install wordfreq subword-nmt sacremoses     # measurement-only tools, not package dependencies
    python3 bench/tools/measure_subword_lengths.py  # about two minutes, one CPU core

Its result is committed as bench/results/newstest-subword-lengths.json and embedded in
``bench/convs2s_bench/workload.py`` (a test checks they agree).
"""

from __future__ import annotations

import argparse
import ast
import os
import gzip
import html
import io
import json
import re
import statistics
import time
from collections import Counter
from importlib.metadata import version
from pathlib import Path

import wordfreq
from sacremoses import MosesTokenizer
from subword_nmt.apply_bpe import BPE
from subword_nmt.learn_bpe import learn_bpe

REPO = Path(__file__).resolve().parents[2]
BENCH_PACKAGE = REPO / "bench" / "convs2s_bench"  # where the speed table's workload is defined
DATA = Path(os.environ.get("CONVS2S_SHARED", REPO.parent / "shared")) / "data"  # read in place, never copied
# wordfreq splits French elisions and drops the apostrophe ("l'homme" -> "l", "homme"); Moses
# keeps it on the first token ("l'", "homme"), so give these forms their apostrophe back.
FR_ELISIONS = {"c", "d", "j", "l", "m", "n", "s", "t", "qu"}
DASH = "@-@"  # Moses -a splits hyphens into this token; in the real vocabulary it is one unit


def moses_tokens(tok: MosesTokenizer, text: str, aggressive: bool) -> list:
    text = text.replace("\u2019", "'")  # as the recipe does for its test sets
    return [t.lower() for t in tok.tokenize(text, escape=False, aggressive_dash_splits=aggressive)]


def pretokenized_tokens(tok: MosesTokenizer, line: str, aggressive: bool) -> list:
    """Tokens of a line that Moses already tokenized and escaped: unescape, add -a's splits."""
    text = html.unescape(line)
    if aggressive:
        pattern, repl = tok.AGGRESSIVE_HYPHEN_SPLIT
        text = pattern.sub(repl, text)
    return [t.lower() for t in text.split()]


def word_counts(lang: str, wordlist: str, cap: int, scale: float, aggressive: bool) -> Counter:
    """wordfreq's top ``cap`` types of ``lang`` as integer counts, split into Moses tokens."""
    freqs = sorted(wordfreq.get_frequency_dict(lang, wordlist=wordlist).items(), key=lambda kv: -kv[1])
    tok = MosesTokenizer(lang=lang)
    counts: Counter = Counter()
    for word, freq in freqs[:cap]:
        n = round(freq * scale)
        if n < 1:
            continue
        if lang == "fr" and word in FR_ELISIONS:
            word += "'"
        for t in moses_tokens(tok, word, aggressive):
            counts[t] += n
    return counts


def learn_codes(args) -> io.StringIO:
    counts = word_counts("en", args.wordlist, args.cap, args.scale, args.aggressive)
    counts.update(word_counts("fr", args.wordlist, args.cap, args.scale, args.aggressive))
    vocab = io.StringIO("".join(f"{w} {n}\n" for w, n in counts.items()))
    codes = io.StringIO()
    learn_bpe(vocab, codes, args.merges, is_dict=True)
    print(f"dictionary: {len(counts)} Moses-token types; learned {len(codes.getvalue().splitlines()) - 1} merges")
    return codes


def read_lines(path: Path) -> list:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        return [line.rstrip("\n") for line in f]


def speed_table_lengths() -> dict:
    """The project's NEWSTEST_LENGTHS (whichever convs2s_bench module defines it), read without torch."""
    for path in sorted(BENCH_PACKAGE.glob("*.py")):
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
            if any(getattr(t, "id", "") == "NEWSTEST_LENGTHS" for t in targets):
                return ast.literal_eval(node.value)
    raise LookupError(f"NEWSTEST_LENGTHS not found under {BENCH_PACKAGE}")


class Segmenter:
    def __init__(self, bpe: BPE, aggressive: bool):
        self.bpe, self.aggressive = bpe, aggressive
        self.tok = {lang: MosesTokenizer(lang=lang) for lang in ("en", "fr")}

    def __call__(self, line: str, lang: str, pretokenized: bool = False, smash_digits: bool = False):
        """(whitespace words, Moses tokens, BPE subwords) of one sentence."""
        tokenize = pretokenized_tokens if pretokenized else moses_tokens
        toks = tokenize(self.tok[lang], line, self.aggressive)
        if smash_digits:  # wordfreq stores multi-digit numbers as 0s ("2013" -> "0000")
            toks = [re.sub(r"\d", "0", t) if sum(c.isdigit() for c in t) > 1 else t for t in toks]
        return len(line.split()), len(toks), len(self.bpe.segment_tokens(toks))


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--newstest", nargs="+", type=Path,
                   default=[DATA / "newstest/newstest2012.en", DATA / "newstest/newstest2013.en"])
    p.add_argument("--newstest-raw", action="store_true",
                   help="the newstest files are raw text (default: Moses-tokenized and escaped)")
    p.add_argument("--parallel-en", type=Path, default=DATA / "multi30k/test_2016_flickr.en.gz")
    p.add_argument("--parallel-fr", type=Path, default=DATA / "multi30k/test_2016_flickr.fr.gz")
    p.add_argument("--merges", type=int, default=40000)
    p.add_argument("--cap", type=int, default=200000, help="top types kept per language")
    p.add_argument("--wordlist", default="large", choices=["large", "best"])
    p.add_argument("--scale", type=float, default=1e9, help="frequency -> integer count factor")
    p.add_argument("--no-aggressive", dest="aggressive", action="store_false",
                   help="tokenize without Moses -a (the recipe splits hyphens: a-b -> a @-@ b)")
    p.add_argument("--codes", type=Path, help="reuse these BPE codes if present, else save them here")
    p.add_argument("--output", type=Path, default=REPO / "bench/results/newstest-subword-lengths.json")
    return p.parse_args(argv)


def make_segmenter(args) -> Segmenter:
    """The BPE of ``--codes`` where that file exists, else learned now (and saved to ``--codes``)."""
    if args.codes and args.codes.exists():
        codes = io.StringIO(args.codes.read_text(encoding="utf-8"))
    else:
        codes = learn_codes(args)
        if args.codes:
            args.codes.write_text(codes.getvalue(), encoding="utf-8")
    return Segmenter(BPE(codes, glossaries=[re.escape(DASH)]), args.aggressive)


def measure_newstest(seg: Segmenter, args) -> dict:
    """Per sentence: whitespace words, Moses tokens, subwords and subwords with digits as 0s; and
    where the word histogram differs from the speed table's."""
    lines = [line for path in args.newstest for line in read_lines(path)]
    pretok = not args.newstest_raw
    rows = [seg(line, "en", pretok) for line in lines]
    words, moses, subs = (list(col) for col in zip(*rows))
    smashed = [seg(line, "en", pretok, smash_digits=True)[2] for line in lines]
    hist_words = Counter(words)
    expected = speed_table_lengths()
    mismatch = {L: [hist_words.get(L, 0), expected.get(L, 0)]
                for L in sorted(set(hist_words) | set(expected)) if hist_words.get(L, 0) != expected.get(L, 0)}
    return dict(words=words, moses=moses, subs=subs, smashed=smashed, mismatch=mismatch, pretokenized=pretok)


def measure_parallel(seg: Segmenter, args) -> dict:
    """Totals per language on the parallel set, and French over English per unit."""
    par = {}
    for lang, path in (("en", args.parallel_en), ("fr", args.parallel_fr)):
        par[lang] = [sum(col) for col in zip(*(seg(line, lang) for line in read_lines(path)))]
    fr_en = {kind: par["fr"][i] / par["en"][i] for i, kind in enumerate(("words", "moses_tokens", "subwords"))}
    return {"en": str(args.parallel_en), "fr": str(args.parallel_fr), "sentences": len(read_lines(args.parallel_en)),
            "totals": {lang: dict(zip(("words", "moses_tokens", "subwords"), v)) for lang, v in par.items()},
            "fr_per_en": fr_en}


def settings(args, pretokenized: bool) -> dict:
    return {"merges": args.merges, "cap_per_language": args.cap, "wordlist": args.wordlist,
            "count_scale": args.scale, "moses_aggressive_dash_splits": args.aggressive,
            "moses_escape": False, "lowercased": True,
            "newstest_pretokenized": pretokenized, "newstest": [str(x) for x in args.newstest],
            "wordfreq": version("wordfreq"), "subword-nmt": version("subword-nmt"),
            "sacremoses": version("sacremoses")}


def lengths_result(m: dict) -> dict:
    """The newstest part of the result: histograms, means, maxima and ratios."""
    words, moses, subs, smashed, n = m["words"], m["moses"], m["subs"], m["smashed"], len(m["words"])
    return {
        "sentences": n,
        "subword_length_histogram": {L: c for L, c in sorted(Counter(subs).items())},
        "mean_subwords": sum(subs) / n,
        "max_subwords": max(subs),
        "mean_words": sum(words) / n,
        "max_words": max(words),
        "mean_moses_tokens": sum(moses) / n,
        "subword_per_word_total": sum(subs) / sum(words),
        "subword_per_word_median": statistics.median(s / w for s, w in zip(subs, words) if w),
        "moses_token_per_word_total": sum(moses) / sum(words),
        "subword_per_moses_token_total": sum(subs) / sum(moses),
        # wordfreq has no multi-digit numbers but 0-masks ("2013" -> "0000"), so the learned BPE
        # spells every number digit by digit; a real 40k BPE keeps common numbers (years, small
        # counts) whole. Masking digits before BPE gives the other bound.
        "digits_as_zeros": {"mean_subwords": sum(smashed) / n, "max_subwords": max(smashed),
                            "subword_length_histogram": {L: c for L, c in sorted(Counter(smashed).items())}},
        "word_histogram_matches_speed_table": not m["mismatch"],
        "word_histogram_mismatches": {L: {"measured": a, "speed_table": b} for L, (a, b) in m["mismatch"].items()},
    }


def report(result: dict, mismatch: dict, args, t0: float) -> None:
    print(f"{result['sentences']} sentences: mean {result['mean_words']:.2f} words (max {result['max_words']}), "
          f"{result['mean_moses_tokens']:.2f} Moses tokens, {result['mean_subwords']:.2f} subwords (max {result['max_subwords']})")
    print(f"subwords/word {result['subword_per_word_total']:.3f} total, {result['subword_per_word_median']:.3f} median; "
          f"Moses tokens/word {result['moses_token_per_word_total']:.3f}; "
          f"mean subwords with digits as 0s {result['digits_as_zeros']['mean_subwords']:.2f}")
    print("word histogram vs NEWSTEST_LENGTHS: " + ("match" if not mismatch else f"MISMATCH {mismatch}"))
    print("fr/en on {}: words {words:.3f}, Moses tokens {moses_tokens:.3f}, subwords {subwords:.3f}".format(
        args.parallel_en.name, **result["parallel_set"]["fr_per_en"]))
    print(f"wrote {args.output} in {time.time() - t0:.0f} s")


def main(argv=None) -> None:
    args = parse_args(argv)
    t0 = time.time()
    seg = make_segmenter(args)
    t_learn = time.time() - t0
    measured = measure_newstest(seg, args)
    result = {"what": "newstest2012+2013 English source lengths in approximate fairseq WMT'14 En-Fr BPE "
                      "subwords (Moses tokenizer + joint En+Fr BPE learned on wordfreq counts)",
              **lengths_result(measured),
              "parallel_set": measure_parallel(seg, args),
              "settings": settings(args, measured["pretokenized"])}
    result["seconds"] = {"dictionary_and_learn_bpe": round(t_learn, 1), "total": round(time.time() - t0, 1)}
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    report(result, measured["mismatch"], args, t0)


if __name__ == "__main__":
    main()
