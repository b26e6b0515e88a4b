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
from convs2s import atomic
from convs2s.dictionary import Dictionary
from convs2s.special_tokens import EOS, NUM_SPECIALS, PAD, SYMBOLS


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
    assert d.symbols[:NUM_SPECIALS] == list(SYMBOLS) == ["<s>", "<pad>", "</s>", "<unk>"]
    assert d.symbols[NUM_SPECIALS:] == ["b", "a", "c"] and d.counts[NUM_SPECIALS:] == [3, 2, 1]


def test_an_interrupted_dictionary_save_leaves_the_old_file(tmp_path, monkeypatch):
    path = tmp_path / "dict.en.txt"
    Dictionary(["a", "b"], [5, 3]).save(path)
    before = path.read_bytes()

    def killed(fd):  # the new text is written, not yet renamed over the old file
        raise KeyboardInterrupt

    monkeypatch.setattr(atomic.os, "fsync", killed)
    with pytest.raises(KeyboardInterrupt):
        Dictionary(["x", "y", "z"]).save(path)
    assert path.read_bytes() == before and Dictionary.load(path).symbols[NUM_SPECIALS:] == ["a", "b"]
    assert [p.name for p in tmp_path.iterdir()] == ["dict.en.txt"], "no temporary file is left behind"


def test_an_interrupted_checkpoint_write_leaves_the_old_checkpoint(tmp_path, monkeypatch):
    path = tmp_path / "checkpoint.pt"
    atomic.atomic_torch_save({"step": torch.tensor(1)}, path)

    def half_written(obj, f):
        f.write(b"PK\x03\x04 half of a zip")
        raise KeyboardInterrupt

    monkeypatch.setattr(atomic.torch, "save", half_written)
    with pytest.raises(KeyboardInterrupt):
        atomic.atomic_torch_save({"step": torch.tensor(2)}, path)
    assert torch.load(path, weights_only=True)["step"] == 1
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint.pt"]


def test_append_line_adds_whole_lines(tmp_path):
    log = tmp_path / "train_log.jsonl"
    atomic.append_line(log, json.dumps({"update": 1}))
    atomic.append_line(log, json.dumps({"update": 2}))
    assert [json.loads(line)["update"] for line in log.read_text().splitlines()] == [1, 2]


def test_every_input_error_is_a_convs2s_error():
    """One family, so ``convs2s.cli.main`` reports any of them as one line (exit 2)."""
    from convs2s.architectures import ConfigError, UnknownOptionError
    from convs2s.dictionary import DictionaryFormatError
    from convs2s.errors import Convs2sError
    from convs2s.fairseq_io import CheckpointError
    from convs2s.generate import GenerationError
    from convs2s.train import TrainingDiverged
    from convs2s.translate import InputError

    for cls in (DataError, CheckpointError, InputError, DictionaryFormatError, ConfigError, UnknownOptionError,
                GenerationError, TrainingDiverged):
        assert issubclass(cls, Convs2sError) and issubclass(cls, ValueError), cls
    assert issubclass(UnknownOptionError, TypeError) and issubclass(TrainingDiverged, RuntimeError)


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
    assert d.symbols[:NUM_SPECIALS] == list(SYMBOLS) and len(d) == len(folder.tgt_dict) > 10
    meta = json.loads((tmp_path / "bin" / "meta.json").read_text())
    assert meta["stats"]["train"]["pairs"] == 300 and meta["stats"]["valid"]["pairs"] == 20
    assert meta["clean"]["valid"]["empty"] == 1
    train = open_data_folder(tmp_path / "bin").load_split("train")
    assert len(train) == 300 and int(train.tgt_tokens.max()) < len(d)
    # joint BPE, separate dictionaries: the target side is upper case, so each dictionary holds
    # only its own side's pieces
    assert not any(c.isupper() for sym in folder.src_dict.symbols[NUM_SPECIALS:] for c in sym)
    assert not any(c.islower() for sym in folder.tgt_dict.symbols[NUM_SPECIALS:] for c in sym)


def test_preparing_again_leaves_no_split_of_the_earlier_run(tmp_path, monkeypatch):
    """A re-run without --valid removes the earlier run's validation split (its ids came from the
    old dictionaries), and while a re-run works the folder does not look complete."""
    src, tgt = synthetic_corpus(120)
    write(tmp_path / "train.en", src)
    write(tmp_path / "train.de", tgt)
    write(tmp_path / "valid.en", src[:10])
    write(tmp_path / "valid.de", tgt[:10])
    quiet = dict(bpe_size=60, log=lambda *a: None)
    folder = prepare(tmp_path / "bin", "en", "de", tmp_path / "train", tmp_path / "valid", **quiet)
    assert folder.split_path("valid").is_file()
    folder = prepare(tmp_path / "bin", "en", "de", tmp_path / "train", **quiet)
    assert not folder.split_path("valid").exists() and "valid" not in folder.meta["stats"]
    import convs2s.data as data

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(data, "train_joint_bpe", interrupted)
    with pytest.raises(KeyboardInterrupt):
        prepare(tmp_path / "bin", "en", "de", tmp_path / "train", **quiet)
    with pytest.raises(FileNotFoundError, match="data prepare"):
        open_data_folder(tmp_path / "bin")


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
