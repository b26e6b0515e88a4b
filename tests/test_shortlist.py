"""Vocabulary selection (convs2s.shortlist): the file, the candidates, and generation with them."""

import pytest
import torch

import convs2s
from convs2s.engine import quantize_decoder_int8
from convs2s.cli import main
from convs2s.data import DataError
from convs2s.dictionary import Dictionary
from convs2s.generate import GenerationError
from convs2s.shortlist import Shortlist

from test_model import V_SRC, V_TGT, small


def dicts():
    return (Dictionary([f"s{i}" for i in range(V_SRC - 4)]), Dictionary([f"t{i}" for i in range(V_TGT - 4)]))


def test_file_parsing_and_candidates(tmp_path):
    src_dict, tgt_dict = dicts()
    f = tmp_path / "lex.txt"
    f.write_text("# comment\ns0 t5 t6\ns1 t7 nosuch\nunknown t8\ns0 t9\n\n")
    sl = Shortlist.from_file(f, src_dict, tgt_dict, top=2)
    assert sl.skipped == 2  # 'nosuch' and the line of 'unknown'
    s0, s1 = src_dict.index("s0"), src_dict.index("s1")
    got = sl.candidates(torch.tensor([[s0, 2], [s1, s1]])).tolist()
    ids = [tgt_dict.index(t) for t in ("t5", "t6", "t7", "t9")]
    assert got == sorted({0, 1, 2, 3, 4, 5} | set(ids))  # specials + top 2 + the two source words' lists
    assert sl.candidates(torch.tensor([[2]])).tolist() == [0, 1, 2, 3, 4, 5]


def test_malformed_file_names_the_line(tmp_path):
    src_dict, tgt_dict = dicts()
    f = tmp_path / "bad.txt"
    f.write_text("s0 t1\nlonely\n")
    with pytest.raises(DataError, match="bad.txt, line 2"):
        Shortlist.from_file(f, src_dict, tgt_dict)
    f.write_text("nothing known\n")
    with pytest.raises(DataError, match="no entry names tokens"):
        Shortlist.from_file(f, src_dict, tgt_dict, top=0)


SOURCES = [[5, 9, 11, 7], [13, 6, 8], [20, 21, 22, 23]]


@pytest.mark.parametrize("int8", [False, True], ids=["fp32", "int8"])
def test_full_vocabulary_shortlist_changes_nothing(int8):
    model = quantize_decoder_int8(small("fconv_iwslt_de_en"), int8)
    full = Shortlist({}, V_TGT, top=V_TGT)
    want = convs2s.generate(model, SOURCES, beam=3, nbest=3, max_len_b=6)
    got = convs2s.generate(model, SOURCES, beam=3, nbest=3, max_len_b=6, shortlist=full)
    for w, g in zip(want, got):
        assert [h["tokens"].tolist() for h in g] == [h["tokens"].tolist() for h in w]
        for a, b in zip(g, w):
            assert a["score"] == pytest.approx(b["score"], abs=1e-6)


def test_greedy_path_inside_the_shortlist_is_kept_with_renormalised_scores():
    model = small("fconv_iwslt_de_en")
    want = convs2s.generate(model, SOURCES, beam=1, max_len_b=6)
    used = sorted({t for hyps in want for t in hyps[0]["tokens"].tolist()})
    table = {s: used for src in SOURCES for s in src}  # every source word lists the greedy tokens
    shortlist = Shortlist(table, V_TGT, top=0)
    got = convs2s.generate(model, SOURCES, beam=1, max_len_b=6, shortlist=shortlist)
    for w, g in zip(want, got):
        assert g[0]["tokens"].tolist() == w[0]["tokens"].tolist()
        # the softmax runs over fewer words: every step's log-probability can only rise
        assert torch.all(g[0]["positional_scores"] >= w[0]["positional_scores"] - 1e-6)
        assert g[0]["score"] > w[0]["score"]


def test_too_small_a_shortlist_for_the_beam_is_an_error():
    model = small("fconv_iwslt_de_en")
    with pytest.raises(GenerationError, match="raise --shortlist-top"):
        convs2s.generate(model, SOURCES, beam=5, shortlist=Shortlist({}, V_TGT, top=2))


def test_translate_command_with_a_shortlist(fixture_dir, tmp_path):
    model, src_dict, tgt_dict = convs2s.load_fairseq(fixture_dir / "checkpoint.pt")
    lines = [l for l in (fixture_dir / "source.txt").read_text().splitlines()][:3] \
        if (fixture_dir / "source.txt").exists() else None
    if lines is None:
        ids = [[int(t) for t in l.split()] for l in (fixture_dir / "source.ids").read_text().splitlines()][:3]
        lines = [src_dict.string(i) for i in ids]
    src = tmp_path / "in.txt"
    src.write_text("\n".join(lines) + "\n")
    lex = tmp_path / "lex.txt"
    lex.write_text("".join(f"{w} {tgt_dict[4 + i % 50]}\n" for i, w in enumerate(sorted({w for l in lines for w in l.split()}))))
    out = tmp_path / "out.txt"
    assert main(["translate", "--fairseq-checkpoint", str(fixture_dir / "checkpoint.pt"), "--input", str(src),
                 "--output", str(out), "--beam", "2", "--max-len-b", "5", "--shortlist", str(lex),
                 "--shortlist-top", "20"]) == 0
    shortlist = Shortlist.from_file(lex, src_dict, tgt_dict, top=20)
    hyps = convs2s.generate(model, [src_dict.encode(l.split()) for l in lines], beam=2, max_len_b=5,
                            shortlist=shortlist)
    assert out.read_text().split("\n")[:-1] == [tgt_dict.string(h[0]["tokens"]) for h in hyps]
    allowed = set()
    for l in lines:
        allowed |= set(shortlist.candidates(torch.tensor([src_dict.encode(l.split())])).tolist())
    assert {t for h in hyps for t in h[0]["tokens"].tolist()} <= allowed
