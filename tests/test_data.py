"""Corpus reading, cleaning, BPE, dictionaries, token-budget batching and collation."""

import gzip
import json

import pytest
import torch

from convs2s.data import (
    DataError,
    TokenDataset,
    batch_by_tokens,
    build_dictionary,
    clean_pairs,
    collate,
    iter_lines,
    open_data_folder,
    prepare,
    read_parallel,
    train_joint_bpe,
)
from convs2s.dictionary import Dictionary
from convs2s.encoder import EOS, PAD


def write(path, lines, gz=False):
    data = ("\n".join(lines) + "\n").encode("utf-8")
    if gz:
        with gzip.open(path, "wb") as f:
            f.write(data)
    else:
        path.write_bytes(data)
    return path


WORDS = ("the a man woman dog cat runs walks sits on in under big small red blue house street park ball "
         "child plays with looks at green").split()


def synthetic_corpus(n, seed=0):
    g = torch.Generator().manual_seed(seed)
    src, tgt = [], []
    for _ in range(n):
        L = int(torch.randint(3, 12, (1,), generator=g))
        words = [WORDS[int(i)] for i in torch.randint(0, len(WORDS), (L,), generator=g)]
        src.append(" ".join(words))
        tgt.append(" ".join(w.upper() for w in reversed(words)))
    return src, tgt


def test_read_parallel_plain_and_gzip(tmp_path):
    s = write(tmp_path / "a.en", ["hello world", "second line"])
    t = write(tmp_path / "a.de.gz", ["hallo welt", "zweite zeile"], gz=True)
    assert read_parallel(s, t) == [("hello world", "hallo welt"), ("second line", "zweite zeile")]


def test_read_parallel_line_count_mismatch_names_files_and_counts(tmp_path):
    s = write(tmp_path / "a.en", ["one", "two", "three"])
    t = write(tmp_path / "a.de", ["eins", "zwei"])
    with pytest.raises(DataError) as exc:
        read_parallel(s, t)
    msg = str(exc.value)
    assert str(s) in msg and str(t) in msg and "3 lines" in msg and "has 2" in msg


def test_empty_corpus_and_unreadable_files(tmp_path):
    s = tmp_path / "e.en"
    s.write_bytes(b"")
    t = tmp_path / "e.de"
    t.write_bytes(b"")
    with pytest.raises(DataError, match="empty"):
        read_parallel(s, t)
    with pytest.raises(FileNotFoundError, match="missing.en"):
        list(iter_lines(tmp_path / "missing.en"))
    bad_gz = tmp_path / "bad.en.gz"
    bad_gz.write_bytes(b"this is not gzip data at all")
    with pytest.raises(DataError, match="cannot read"):
        list(iter_lines(bad_gz))
    bad_utf8 = tmp_path / "bad.en"
    bad_utf8.write_bytes(b"fine\n\xff\xfe broken\n")
    with pytest.raises(DataError, match=r"bad.en:2: invalid UTF-8"):
        list(iter_lines(bad_utf8))


def test_clean_pairs_reports_each_reason():
    pairs = [("a b c", "x y z"), ("", "x"), ("a " * 200, "x " * 200), ("a", "x y z w"), ("a b", "x y z w"), ("a b", "x y z")]
    kept, report = clean_pairs(pairs, max_len=175, max_ratio=1.5)
    assert kept == [("a b c", "x y z"), ("a b", "x y z")]  # ratio 1.5 exactly is kept
    assert (report.kept, report.empty, report.too_long, report.bad_ratio) == (2, 1, 1, 2)
    kept, report = clean_pairs(pairs, max_len=None, max_ratio=None)
    assert len(kept) == 5 and report.empty == 1


def test_bpe_vocabulary_too_large_is_a_clear_error(tmp_path):
    src, tgt = synthetic_corpus(50)
    with pytest.raises(DataError, match="--bpe-size"):
        train_joint_bpe(src + tgt, tmp_path / "spm", 50000)


def test_build_dictionary_orders_by_count_after_the_specials():
    d = build_dictionary([["b", "a", "b"], ["c", "b", "a"]])
    assert d.symbols[:4] == ["<s>", "<pad>", "</s>", "<unk>"]
    assert d.symbols[4:] == ["b", "a", "c"] and d.counts[4:] == [3, 2, 1]


def test_token_dataset_appends_eos_and_round_trips():
    ds = TokenDataset([[5, 6, 7], [8]], [[9], [10, 11]])
    assert ds.source(0).tolist() == [5, 6, 7, EOS] and ds.target(1).tolist() == [10, 11, EOS]
    assert ds.src_lengths.tolist() == [4, 2] and ds.tgt_lengths.tolist() == [2, 3]
    back = TokenDataset.from_state_dict(ds.state_dict())
    assert torch.equal(back.src_tokens, ds.src_tokens) and torch.equal(back.tgt_offsets, ds.tgt_offsets)
    broken = dict(ds.state_dict(), src_offsets=torch.tensor([0, 2, 99]))
    with pytest.raises(DataError, match="inconsistent"):
        TokenDataset.from_state_dict(broken, "x.pt")


def test_batch_by_tokens_respects_the_budget_and_covers_every_example_once():
    g = torch.Generator().manual_seed(3)
    src = torch.randint(2, 40, (500,), generator=g)
    tgt = torch.randint(2, 40, (500,), generator=g)
    batches = batch_by_tokens(src, tgt, 300, seed=1, epoch=1)
    flat = sorted(i for b in batches for i in b)
    assert flat == list(range(500))
    for b in batches:
        width = int(torch.maximum(src[b], tgt[b]).max())
        assert width * len(b) <= 300
    # a batch is closed only when the next example would overflow it: batches are full-ish
    assert len(batches) < 500 * 40 / 300 * 1.6
    assert batches == batch_by_tokens(src, tgt, 300, seed=1, epoch=1)  # deterministic
    assert batches != batch_by_tokens(src, tgt, 300, seed=1, epoch=2)  # reshuffled per epoch
    capped = batch_by_tokens(src, tgt, 300, max_sentences=4, seed=1)
    assert max(len(b) for b in capped) <= 4


def test_batch_by_tokens_rejects_an_example_over_the_budget():
    with pytest.raises(DataError, match="--max-tokens 10"):
        batch_by_tokens(torch.tensor([3, 12]), torch.tensor([3, 4]), 10)


def test_collate_matches_fairseq_layout():
    src = [[5, 6, 7], [8], [9, 10]]
    tgt = [[11], [12, 13, 14], [15, 16]]
    ds = TokenDataset(src, tgt)
    b = collate(ds, [0, 1, 2])
    for row, (s, t) in enumerate(zip(src, tgt)):
        S, T = b.src_tokens.shape[1], b.target.shape[1]
        s_eos, t_eos = s + [EOS], t + [EOS]
        assert b.src_tokens[row].tolist() == [PAD] * (S - len(s_eos)) + s_eos
        assert b.target[row].tolist() == t_eos + [PAD] * (T - len(t_eos))
        assert b.prev_output_tokens[row].tolist() == [EOS] + t + [PAD] * (T - len(t_eos))
    assert b.src_lengths.tolist() == [4, 2, 3] and b.ntokens == 2 + 4 + 3


def test_prepare_writes_a_fairseq_data_folder(tmp_path):
    src, tgt = synthetic_corpus(300)
    write(tmp_path / "train.en", src)
    write(tmp_path / "train.de.gz", tgt, gz=True)
    write(tmp_path / "valid.en", src[:20] + [""])
    write(tmp_path / "valid.de", tgt[:20] + [""])
    folder = prepare(tmp_path / "bin", "en", "de", tmp_path / "train", tmp_path / "valid", bpe_size=80,
                     log=lambda *a: None)
    assert (tmp_path / "bin" / "spm.model").is_file()
    d = Dictionary.load(tmp_path / "bin" / "dict.de.txt")
    assert d.symbols[:4] == ["<s>", "<pad>", "</s>", "<unk>"] and len(d) == len(folder.tgt_dict) > 10
    meta = json.loads((tmp_path / "bin" / "meta.json").read_text())
    assert meta["stats"]["train"]["pairs"] == 300 and meta["stats"]["valid"]["pairs"] == 20
    assert meta["clean"]["valid"]["empty"] == 1
    train = open_data_folder(tmp_path / "bin").load_split("train")
    assert len(train) == 300 and int(train.tgt_tokens.max()) < len(d)
    # joint BPE, separate dictionaries: the target side is upper case, so each dictionary holds
    # only its own side's pieces
    assert not any(c.isupper() for sym in folder.src_dict.symbols[4:] for c in sym)
    assert not any(c.islower() for sym in folder.tgt_dict.symbols[4:] for c in sym)


def test_corrupt_dataset_file_is_reported(tmp_path):
    src, tgt = synthetic_corpus(100)
    write(tmp_path / "train.en", src)
    write(tmp_path / "train.de", tgt)
    folder = prepare(tmp_path / "bin", "en", "de", tmp_path / "train", bpe_size=60, log=lambda *a: None)
    folder.split_path("train").write_bytes(b"\x00garbage")
    with pytest.raises(DataError, match="corrupt or truncated"):
        folder.load_split("train")
    with pytest.raises(FileNotFoundError, match="valid"):
        folder.load_split("valid")
    with pytest.raises(FileNotFoundError, match="data prepare"):
        open_data_folder(tmp_path)


def test_multi30k_fetch_from_a_local_mirror(tmp_path):
    from conftest import SHARED, require_shared

    from convs2s.multi30k import download

    mirror = require_shared(SHARED / "data" / "multi30k")
    files = download(tmp_path / "m30k", ["en", "de"], splits=["val"], mirror=str(mirror), log=lambda *a: None)
    assert [f.name for f in files] == ["val.en.gz", "val.de.gz"]
    pairs = read_parallel(*files)
    assert len(pairs) == 1014 and all(s and t for s, t in pairs)
    with pytest.raises(DataError, match="no language 'xx'"):
        download(tmp_path / "m30k", ["xx"], mirror=str(mirror))
    with pytest.raises(DataError, match="could not fetch"):
        download(tmp_path / "other", ["en"], splits=["val"], mirror=str(tmp_path / "empty"), log=lambda *a: None)
    assert not list((tmp_path / "other").iterdir())  # nothing half-written left behind
