"""Text in and out: the translate / generate commands, unknown-word replacement, bad input."""

import io
import sys

import pytest
import torch

import convs2s
from convs2s.cli import main
from convs2s.translate import Tokenizer, replace_unk


def test_replace_unk_uses_most_attended_source_word():
    src = ["das", "Haus", "ist", "blau"]
    hypo = ["the", "<unk>", "is", "<unk>"]
    alignment = [0, 1, 2, 3]
    out = replace_unk(hypo, src, alignment, {"Haus": "house"})
    assert out == ["the", "house", "is", "blau"]  # translated from the dictionary, else copied


def test_unk_replacement_follows_attention_argmax():
    attention = torch.tensor([[0.1, 0.7], [0.8, 0.2], [0.1, 0.1]])  # source (incl. EOS) x target
    alignment = attention.argmax(0).tolist()
    assert replace_unk(["<unk>", "<unk>"], ["a", "b"], alignment, {"b": "B"}) == ["B", "a"]


def fixture_lines(fixture_dir):
    return [" ".join(f"w{t}" for t in line.split()) for line in (fixture_dir / "source.ids").read_text().splitlines()]


def run_cli(args, stdin_bytes=None, monkeypatch=None, capsys=None):
    if stdin_bytes is not None:
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin_bytes)))
    rc = main(args)
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_translate_command_matches_generate(fixture_dir, tmp_path, capsys):
    lines = fixture_lines(fixture_dir)[:4]
    src = tmp_path / "in.txt"
    src.write_text("\n".join(lines[:2] + [""] + lines[2:]) + "\n")
    out_file = tmp_path / "out.txt"
    ckpt = str(fixture_dir / "checkpoint.pt")
    rc = main(["translate", "--fairseq-checkpoint", ckpt, "--input", str(src), "--output", str(out_file),
               "--beam", "3", "--max-len-a", "1.2", "--max-len-b", "5", "--chunk-size", "2"])
    err = capsys.readouterr().err
    assert rc == 0
    assert "line 3 is empty" in err
    got = out_file.read_text().split("\n")[:-1]
    assert len(got) == 5 and got[2] == ""
    model, src_dict, tgt_dict = convs2s.load_fairseq(ckpt)
    ids = [src_dict.encode(l.split()) for l in lines]
    want = [tgt_dict.string(h[0]["tokens"]) for h in convs2s.generate(model, ids, beam=3, max_len_a=1.2, max_len_b=5)]
    assert got[:2] + got[3:] == want


def test_generate_command_prints_fairseq_lines_and_bleu(fixture_dir, tmp_path, capsys):
    lines = fixture_lines(fixture_dir)[:3]
    src = tmp_path / "in.txt"
    src.write_text("\n".join(lines) + "\n")
    ref = tmp_path / "ref.txt"
    ref.write_text("\n".join(lines) + "\n")
    rc = main(["generate", "--fairseq-checkpoint", str(fixture_dir / "checkpoint.pt"), "--input", str(src),
               "--reference", str(ref), "--beam", "2", "--max-len-b", "5", "--print-alignment"])
    out = capsys.readouterr().out
    assert rc == 0
    for prefix in ("S-0\t", "H-0\t", "P-0\t", "A-0\t", "S-2\t"):
        assert prefix in out
    assert "BLEU = " in out and "signature: nrefs:1" in out


def test_bad_inputs_name_line_or_file(fixture_dir, tmp_path, capsys, monkeypatch):
    ckpt = str(fixture_dir / "checkpoint.pt")
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"w5 w6\n\xff\xfe w7\n")
    out_file = tmp_path / "out.txt"
    rc = main(["translate", "--fairseq-checkpoint", ckpt, "--input", str(bad), "--output", str(out_file),
               "--max-len-b", "3"])
    err = capsys.readouterr().err
    assert rc == 2 and f"--input {bad}:2: invalid UTF-8" in err
    assert not out_file.exists(), "a file is read through before the model loads: nothing is written"
    # from stdin, read as it comes (default chunk size: the good line shares the bad line's chunk)
    rc, out, err = run_cli(["translate", "--fairseq-checkpoint", ckpt, "--max-len-b", "3"],
                           stdin_bytes=bad.read_bytes(), monkeypatch=monkeypatch, capsys=capsys)
    assert rc == 2 and "<stdin>:2: invalid UTF-8" in err
    assert len(out.splitlines()) == 1, "the line translated before the bad one is kept"

    rc = main(["translate", "--fairseq-checkpoint", ckpt, "--input", str(bad), "--spm", str(tmp_path / "no.model")])
    assert rc == 2 and f"--spm {tmp_path / 'no.model'}: no such file" in capsys.readouterr().err  # before loading

    good = tmp_path / "good.txt"
    good.write_text("w5 w6\n")
    rc = main(["translate", "--fairseq-checkpoint", str(tmp_path / "none.pt"), "--input", str(good)])
    assert rc == 2 and f"--fairseq-checkpoint {tmp_path / 'none.pt'}: no such checkpoint" in capsys.readouterr().err

    long_line = tmp_path / "long.txt"
    long_line.write_text(" ".join(["w5"] * 1100) + "\n")
    rc = main(["translate", "--fairseq-checkpoint", ckpt, "--input", str(long_line), "--max-len-b", "2",
               "--output", str(out_file)])
    err = capsys.readouterr().err
    assert rc == 1 and "line 1 has 1100 tokens; truncated to the model's 1021" in err  # translated, status 1


def test_sentencepiece_tokenizer_round_trip(tmp_path):
    spm = pytest.importorskip("sentencepiece")
    corpus = tmp_path / "corpus.txt"
    words = ["house", "blue", "the", "is", "a", "dog", "runs", "green", "tree", "small"]
    g = torch.Generator().manual_seed(0)
    corpus.write_text("\n".join(" ".join(words[i] for i in torch.randint(0, 10, (8,), generator=g).tolist())
                                for _ in range(200)) + "\n")
    spm.SentencePieceTrainer.train(input=str(corpus), model_prefix=str(tmp_path / "sp"), vocab_size=25,
                                   minloglevel=2)
    tok = Tokenizer(str(tmp_path / "sp.model"))
    text = "the small dog is blue"
    pieces = tok.encode(text)
    assert len(pieces) >= 5 and tok.decode(pieces) == text


def test_remove_bpe():
    assert Tokenizer(remove_bpe="@@ ").decode(["the", "hou@@", "se", "is"]) == "the house is"


def _never_read(tmp_path) -> str:
    """A checkpoint file that exists (the file checks pass) and that a bad option stops before reading."""
    path = tmp_path / "never-read.pt"
    path.write_bytes(b"never read")
    return str(path)


def one_line_error(capsys) -> str:
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and err.startswith("error: ") and "Traceback" not in err, err
    return err


def test_bad_options_fail_before_loading(tmp_path, capsys):
    assert main(["translate", "--fairseq-checkpoint", _never_read(tmp_path), "--backend", "fastest"]) == 2
    assert "unknown backend 'fastest'" in one_line_error(capsys)
    with pytest.raises(SystemExit) as exit_:
        main(["translate", "--min-len", "-1"])
    assert exit_.value.code == 2 and "must be >= 0" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:
        main(["translate", "--beam", "x"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "--beam: expected a whole number, got 'x'" in err and "_positive_int" not in err


def test_an_output_that_cannot_be_written_is_one_line(tmp_path, capsys):
    assert main(["translate", "--fairseq-checkpoint", str(tmp_path / "model.pt"), "--output", str(tmp_path)]) == 2
    assert f"--output {tmp_path} is a folder; name a file" in one_line_error(capsys)


def test_search_options_and_missing_files_fail_before_loading(tmp_path, capsys):
    never = ["--fairseq-checkpoint", _never_read(tmp_path)]
    assert main(["generate", *never, "--beam", "5", "--nbest", "6"]) == 2
    assert "need 1 <= nbest <= beam, got beam=5, nbest=6" in one_line_error(capsys)
    for flag in ("--spm", "--replace-unk", "--shortlist"):
        assert main(["translate", *never, flag, str(tmp_path / "missing")]) == 2
        assert one_line_error(capsys) == f"error: {flag} {tmp_path / 'missing'}: no such file\n"
    assert main(["translate", *never, "--nbest", "2"]) == 2
    assert "for n-best lists use `convs2s generate --nbest N`" in one_line_error(capsys)


def test_threads_sets_torch_threads(fixture_dir, tmp_path, monkeypatch):
    asked = []
    monkeypatch.setattr(torch, "set_num_threads", asked.append)
    src = tmp_path / "in.txt"
    src.write_text(fixture_lines(fixture_dir)[0] + "\n")
    assert main(["translate", "--fairseq-checkpoint", str(fixture_dir / "checkpoint.pt"), "--input", str(src),
                 "--output", str(tmp_path / "out.txt"), "--beam", "2", "--max-len-b", "3", "--threads", "1"]) == 0
    assert asked == [1]


def test_typed_lines_are_translated_one_at_a_time(monkeypatch):
    from argparse import Namespace

    from convs2s.cli import _chunk_size

    monkeypatch.setattr(sys.stdin, "isatty", lambda: True, raising=False)
    assert _chunk_size(Namespace(chunk_size=None, input="-")) == 1
    assert _chunk_size(Namespace(chunk_size=None, input="file.txt")) == 512
    assert _chunk_size(Namespace(chunk_size=7, input="-")) == 7
    monkeypatch.setattr(sys.stdin, "isatty", lambda: False, raising=False)
    assert _chunk_size(Namespace(chunk_size=None, input="-")) == 512


def test_special_symbols_in_the_text_are_words(fixture_dir, tmp_path, capsys):
    """<pad>, <s> and </s> typed in a line are read as <unk> (with a note), never as the model's
    padding or end of sentence."""
    line = fixture_lines(fixture_dir)[0].split()
    src = tmp_path / "in.txt"
    src.write_text(" ".join(line[:2] + ["<pad>", "</s>"] + line[2:]) + "\n" + " ".join(line) + "\n")
    ckpt = str(fixture_dir / "checkpoint.pt")
    assert main(["translate", "--fairseq-checkpoint", ckpt, "--input", str(src), "--beam", "2", "--max-len-b", "5"]) == 0
    captured = capsys.readouterr()
    assert "warning: line 1: </s>, <pad> read as <unk>" in captured.err and len(captured.out.splitlines()) == 2
    model, src_dict, tgt_dict = convs2s.load_fairseq(ckpt)
    ids = src_dict.encode(line[:2]) + [3, 3] + src_dict.encode(line[2:])
    want = tgt_dict.string(convs2s.generate(model, [ids], beam=2, max_len_b=5)[0][0]["tokens"])
    assert captured.out.splitlines()[0] == want


def test_bad_options_leave_an_existing_output_alone(tmp_path, capsys):
    out = tmp_path / "out.txt"
    out.write_text("yesterday's translations\n")
    assert main(["translate", "--fairseq-checkpoint", _never_read(tmp_path), "--output", str(out), "--backend", "fastest"]) == 2
    assert "unknown backend 'fastest'" in one_line_error(capsys)
    assert out.read_text() == "yesterday's translations\n"


@pytest.mark.parametrize("variant", ["int8", "int8w", "int7", "w7a7", "int8e", "int7e", "w7a7e", "bf16"])
def test_translate_compute_type_equals_generate_with_that_variant(variant, fixture_dir, tmp_path):
    """Every compute type the command takes by name decodes as the model does with that variant
    applied (int8 weights and activations, the encoder alike or not; bf16 weights)."""
    from convs2s.compute_type import apply_variant

    lines = fixture_lines(fixture_dir)[:3]
    src, out_file = tmp_path / "in.txt", tmp_path / "out.txt"
    src.write_text("\n".join(lines) + "\n")
    ckpt = str(fixture_dir / "checkpoint.pt")
    model, src_dict, tgt_dict = convs2s.load_fairseq(ckpt)
    ids = [src_dict.encode(l.split()) for l in lines]
    assert main(["translate", "--fairseq-checkpoint", ckpt, "--input", str(src), "--output", str(out_file),
                 "--beam", "2", "--max-len-b", "5", "--compute-type", variant, "--fold-attention"]) == 0
    hyps = convs2s.generate(apply_variant(model, variant), ids, beam=2, max_len_b=5, fold_attention=True)
    assert out_file.read_text().split("\n")[:-1] == [tgt_dict.string(h[0]["tokens"]) for h in hyps]


def test_translate_int8_takes_the_measured_fastest_variant(fixture_dir, tmp_path, monkeypatch, capsys):
    """``--compute-type int8`` measures the int8 variants and decodes with the fastest, saying so."""
    from convs2s import compute_type as ct

    seen = []

    def fake(model, names, **kw):
        seen.append(list(names))
        return {n: [0.5, 5.0] if n == "int7e" else [1.0, 10.0] for n in names}

    monkeypatch.setattr(ct, "measure_decoding", fake)
    monkeypatch.setenv("CONVS2S_TUNE", "1")
    monkeypatch.setenv("CONVS2S_TUNE_CACHE", str(tmp_path / "cache"))  # measured here, not read
    src = tmp_path / "in.txt"
    src.write_text(fixture_lines(fixture_dir)[0] + "\n")
    assert main(["translate", "--fairseq-checkpoint", str(fixture_dir / "checkpoint.pt"), "--input", str(src),
                 "--beam", "2", "--max-len-b", "5", "--compute-type", "int8"]) == 0
    assert seen == [list(ct.INT8_VARIANTS)]
    assert "compute type: int7e (measured" in capsys.readouterr().err


@pytest.mark.parametrize("bad", ["int4", "fp16x", "auto8"])
def test_unknown_compute_types_are_refused_before_loading(bad, capsys, monkeypatch, tmp_path):
    assert main(["translate", "--fairseq-checkpoint", _never_read(tmp_path), "--compute-type", bad]) == 2
    assert f"unknown compute type {bad!r}" in one_line_error(capsys)
    out = tmp_path / "out.txt"
    out.write_text("yesterday's translations\n")
    monkeypatch.setenv("CONVS2S_COMPUTE_TYPE", bad)  # the environment's, before --output is emptied
    assert main(["translate", "--fairseq-checkpoint", _never_read(tmp_path), "--output", str(out)]) == 2
    assert f"unknown compute type {bad!r}" in one_line_error(capsys)
    assert out.read_text() == "yesterday's translations\n"


