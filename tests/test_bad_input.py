"""Issue 62: bad input to every command, one table per command. Each case gets one line naming the
problem (``error: ...``, never a traceback nor PyTorch's advice about ``weights_only``), a non-zero
exit, and nothing measured, and leaves an earlier output as it was. The checks that need no model
come first (convs2s.checks): a missing input costs no model load and no measurement."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import convs2s
import convs2s.compute_type as compute_type
from convs2s.cli import main
from convs2s_kernels.tune import timing

from conftest import FIXTURE, REPO, require_shared

EARLIER = "an earlier run's output\n"


@pytest.fixture(autouse=True)
def _nothing_measured(monkeypatch, tmp_path):
    """Any case that measured a kernel choice or a compute type fails: bad input is found first."""
    def measured(*a, **k):
        raise AssertionError("bad input was measured before it was refused")
    monkeypatch.setattr(timing, "measure", measured)
    monkeypatch.setattr(compute_type, "measure_decoding", measured)
    monkeypatch.setenv("CONVS2S_TUNE_CACHE", str(tmp_path / "tune-cache"))


@pytest.fixture
def files(tmp_path):
    """Named bad (and good) files, made on demand."""
    made = {
        "missing": lambda p: None,
        "folder": lambda p: p.mkdir(),
        "empty": lambda p: p.write_bytes(b""),
        "utf8": lambda p: p.write_bytes(b"w5 w6\n\xff\xfe w7\n"),
        "garbage": lambda p: p.write_bytes(bytes(range(256)) * 8),
        "html": lambda p: p.write_text("<!DOCTYPE html><html><body>Not Found</body></html>\n"),
        "text": lambda p: p.write_text("w5 w6\nw7\n"),
    }

    def make(kind: str, name: str = None) -> Path:
        p = tmp_path / (name or f"{kind}.file")
        made[kind](p)
        return p
    return make


def one_error_line(capsys) -> str:
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert "Traceback" not in err and "weights_only" not in err and "arbitrary code" not in err, err
    return lines[0]


def refused(argv, capsys, *, says: str, rc: int = 2) -> str:
    got = main([str(a) for a in argv])
    line = one_error_line(capsys)
    assert got == rc and says in line, line
    return line


def _checkpoint() -> Path:
    return require_shared(FIXTURE) / "checkpoint.pt"


# --- translate and generate ------------------------------------------------------------------------------
TRANSLATE_CASES = {
    # case: (argument, kind of file, what the line says)
    "input missing": ("--input", "missing", "no such input file"),
    "input a folder": ("--input", "folder", "a folder, not an input file"),
    "input empty": ("--input", "empty", "the input file is empty"),
    "input not UTF-8": ("--input", "utf8", ":2: invalid UTF-8"),
    "checkpoint missing": ("--fairseq-checkpoint", "missing", "no such checkpoint"),
    "checkpoint a folder": ("--fairseq-checkpoint", "folder", "a folder, not a checkpoint"),
    "checkpoint empty": ("--fairseq-checkpoint", "empty", "the checkpoint is empty"),
    "checkpoint random bytes": ("--fairseq-checkpoint", "garbage", "is not a PyTorch checkpoint"),
    "checkpoint an HTML page": ("--fairseq-checkpoint", "html", "is not a PyTorch checkpoint"),
    "dictionaries missing": ("--fairseq-dicts", "missing", "no such folder"),
    "output's folder missing": ("--output", "missing-folder", "does not exist"),
    "output a folder": ("--output", "folder", "is a folder; name a file"),
}


@pytest.mark.parametrize("case", TRANSLATE_CASES)
def test_translate_refuses_bad_input_in_one_line_and_keeps_the_earlier_output(case, files, tmp_path, capsys):
    flag, kind, says = TRANSLATE_CASES[case]
    args = {"--fairseq-checkpoint": _checkpoint(), "--input": files("text"), "--output": tmp_path / "out.txt"}
    args["--output"].write_text(EARLIER)
    args[flag] = tmp_path / "no" / "out.txt" if kind == "missing-folder" else files(kind)
    refused(["translate", *[v for kv in args.items() for v in kv], "--beam", "2", "--max-len-b", "3"], capsys, says=says)
    assert (tmp_path / "out.txt").read_text() == EARLIER


def test_translate_refuses_dictionaries_of_another_model(files, tmp_path, capsys):
    dicts = tmp_path / "dicts"
    dicts.mkdir()
    for lang in ("src", "tgt"):  # fewer words than the checkpoint's embeddings
        (dicts / f"dict.{lang}.txt").write_text("".join(f"w{i} 1\n" for i in range(5)))
    out = tmp_path / "out.txt"
    out.write_text(EARLIER)
    refused(["translate", "--fairseq-checkpoint", _checkpoint(), "--fairseq-dicts", dicts, "--input", files("text"),
             "--output", out], capsys, says="wrong dictionary or swapped languages?")
    assert out.read_text() == EARLIER


def test_a_sentence_longer_than_the_positions_is_named_and_the_status_says_so(fixture_dir, tmp_path, capsys):
    """Every line is translated (the output stays line for line; the long one from its first
    tokens), one warning names the line, and the exit status is 1."""
    src = tmp_path / "in.txt"
    src.write_text("w5 w6\n" + " ".join(["w5"] * 1100) + "\nw7\n")
    out = tmp_path / "out.txt"
    rc = main(["translate", "--fairseq-checkpoint", str(fixture_dir / "checkpoint.pt"), "--input", str(src),
               "--output", str(out), "--beam", "2", "--max-len-b", "3"])
    warnings = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning:")]
    assert rc == 1 and warnings == ["warning: line 2 has 1100 tokens; truncated to the model's 1021"]
    assert len(out.read_text().splitlines()) == 3


GENERATE_CASES = {
    "reference missing": ("--reference", "missing", "no such reference file"),
    "reference not UTF-8": ("--reference", "utf8", ":2: invalid UTF-8"),
    "reference empty": ("--reference", "empty", "the reference file is empty"),
    "input a folder": ("--input", "folder", "a folder, not an input file"),
    "checkpoint random bytes": ("--fairseq-checkpoint", "garbage", "is not a PyTorch checkpoint"),
}


@pytest.mark.parametrize("case", GENERATE_CASES)
def test_generate_refuses_bad_input_in_one_line(case, files, capsys):
    flag, kind, says = GENERATE_CASES[case]
    args = {"--fairseq-checkpoint": _checkpoint(), "--input": files("text"), "--reference": files("text", "ref.txt")}
    args[flag] = files(kind)
    refused(["generate", *[v for kv in args.items() for v in kv], "--beam", "2", "--max-len-b", "3"], capsys, says=says)


def test_a_missing_input_costs_no_model_load_and_no_measurement(tmp_path, capsys, monkeypatch):
    """Issue 62: `translate` with a missing input answers in about a second (not after loading the
    model and measuring its compute type), and writes no cache entry."""
    def loaded(*a, **k):
        raise AssertionError("the model was loaded before the input was checked")
    monkeypatch.setattr(convs2s, "load_fairseq", loaded)
    ckpt = tmp_path / "model.pt"
    torch.save({"model": {}}, ckpt)  # a checkpoint that exists: it is never read
    t0 = time.perf_counter()
    refused(["translate", "--fairseq-checkpoint", ckpt, "--input", tmp_path / "missing.txt", "--output",
             tmp_path / "out.txt"], capsys, says="no such input file")
    assert time.perf_counter() - t0 < 2.0
    assert not (tmp_path / "out.txt").exists() and not (tmp_path / "tune-cache").exists()


def test_a_missing_input_is_answered_before_torch_is_imported(tmp_path):
    """The command line itself: `python3 -m convs2s translate` with a missing input answers from
    its file checks, before importing torch (seconds) or reading the checkpoint (1 GB for the
    paper's En-Fr model), in well under 2 s."""
    ckpt = tmp_path / "model.pt"
    ckpt.write_bytes(b"never read")
    code = ("import sys; from convs2s.cli import main\n"
            f"rc = main(['translate', '--fairseq-checkpoint', {str(ckpt)!r}, '--input', {str(tmp_path / 'no.txt')!r}])\n"
            "print(rc, 'torch' in sys.modules)")
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path,
                          env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert time.perf_counter() - t0 < 2.0
    assert proc.stdout.split() == ["2", "False"], proc.stdout + proc.stderr
    assert proc.stderr.strip() == f"error: --input {tmp_path / 'no.txt'}: no such input file"


def test_an_interrupted_translation_keeps_every_finished_line_whole(fixture_dir, tmp_path):
    """SIGINT mid-way: status 130, `interrupted`, and the output holds the lines translated so
    far, each whole and in order (the first of them as a run of those lines alone writes them)."""
    words = "w5 w6 w7 w8"
    src = tmp_path / "in.txt"
    src.write_text("\n".join([words] * 20000) + "\n")
    out = tmp_path / "out.txt"
    cmd = [sys.executable, "-m", "convs2s", "translate", "--fairseq-checkpoint", str(fixture_dir / "checkpoint.pt"),
           "--input", str(src), "--output", str(out), "--beam", "2", "--max-len-b", "3", "--chunk-size", "1",
           "--compute-type", "fp32", "--threads", "1"]
    env = dict(os.environ, PYTHONPATH=str(REPO))
    # SIGINT as a terminal sends it: a test worker may ignore it, and a child inherits that
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, env=env, cwd=tmp_path,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None and \
            (not out.exists() or out.read_text().count("\n") < 3):
        time.sleep(0.05)
    assert proc.poll() is None, proc.stderr.read().decode()
    proc.send_signal(signal.SIGINT)
    try:
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    text = out.read_text()
    assert proc.returncode == 130 and "interrupted" in err.decode(), err.decode()
    assert text.endswith("\n") and 3 <= text.count("\n") < 20000  # finished lines, each whole
    first = tmp_path / "first.txt"
    first.write_text(words + "\n")
    assert main(["translate", "--fairseq-checkpoint", str(fixture_dir / "checkpoint.pt"), "--input", str(first),
                 "--output", str(tmp_path / "want.txt"), "--beam", "2", "--max-len-b", "3",
                 "--compute-type", "fp32"]) == 0
    want = (tmp_path / "want.txt").read_text()
    assert set(text.splitlines()) == {want.strip()}  # the same line translated alike throughout


# --- train ----------------------------------------------------------------------------------------------
def _data_folder(tmp_path) -> Path:
    from test_train import make_copy_data

    return Path(make_copy_data(tmp_path / "data", 40))


TRAIN_CASES = {
    "data folder missing": (lambda d, s: (s.parent / "nowhere", s), "no such data folder"),
    "data a file": (lambda d, s: (d / "meta.json", s), "a file, not a data folder"),
    "data not prepared": (lambda d, s: (s.parent, s), "is not a convs2s data folder"),
    "training split missing": (lambda d, s: ((d / "train.src-tgt.pt").unlink() or d, s), "no such training split"),
    "save folder a file": (lambda d, s: (d, d / "meta.json"), "a file, not a folder"),
    "a run there, no --resume": (lambda d, s: ((s / "checkpoint_last.pt").write_bytes(b"x") and d, s),
                                 "pass --resume to continue that run"),
}


@pytest.mark.parametrize("case", TRAIN_CASES)
def test_train_refuses_bad_input_before_measuring_or_loading(case, tmp_path, capsys, monkeypatch):
    import convs2s.cli as cli

    def measured(*a, **k):
        raise AssertionError("the precision was measured before the files were checked")
    monkeypatch.setattr(cli, "_train_precision", measured)
    save = tmp_path / "save"
    save.mkdir()
    data, save = TRAIN_CASES[case][0](_data_folder(tmp_path), save)
    refused(["train", data, "--save-dir", save, "--arch", "fconv"], capsys, says=TRAIN_CASES[case][1])


# --- data prepare ---------------------------------------------------------------------------------------
PREPARE_CASES = {
    "corpus missing": ("missing", "no corpus file for language 'de'"),
    "corpus empty": ("empty", "the corpus file is empty"),
    "corpus not UTF-8": ("utf8", ":2: invalid UTF-8"),
    "corpus a folder": ("folder", "no corpus file for language 'de'"),
}


@pytest.mark.parametrize("case", PREPARE_CASES)
def test_data_prepare_refuses_bad_input_in_one_line(case, files, tmp_path, capsys):
    kind, says = PREPARE_CASES[case]
    files("text", "train.en")
    files(kind, "train.de")
    refused(["data", "prepare", "--train", tmp_path / "train", "-s", "de", "-t", "en", "--out", tmp_path / "bin"],
            capsys, says=says)
    assert not (tmp_path / "bin").exists()  # nothing written


def test_data_prepare_refuses_an_output_that_is_a_file(files, tmp_path, capsys):
    files("text", "train.en")
    files("text", "train.de")
    refused(["data", "prepare", "--train", tmp_path / "train", "-s", "de", "-t", "en", "--out", files("text")],
            capsys, says="a file, not a folder")


# --- average-checkpoints --------------------------------------------------------------------------------
AVERAGE_CASES = {
    "checkpoint missing": ("missing", "no such checkpoint"),
    "checkpoint a folder": ("folder", "a folder, not a checkpoint"),
    "checkpoint empty": ("empty", "the checkpoint is empty"),
    "checkpoint random bytes": ("garbage", "is not a PyTorch checkpoint"),
    "checkpoint an HTML page": ("html", "is not a PyTorch checkpoint"),
    "output's folder missing": ("missing-folder", "does not exist"),
}


@pytest.mark.parametrize("case", AVERAGE_CASES)
def test_average_checkpoints_refuses_bad_input_and_keeps_the_earlier_output(case, files, tmp_path, capsys):
    kind, says = AVERAGE_CASES[case]
    good = tmp_path / "a.pt"
    torch.save({"model": {"w": torch.ones(2)}}, good)
    out = tmp_path / "avg.pt"
    out.write_text(EARLIER)
    if kind == "missing-folder":
        out = tmp_path / "no" / "avg.pt"
        inputs = [good, good]
    else:
        inputs = [good, files(kind)]
    refused(["average-checkpoints", "--inputs", *inputs, "--output", out], capsys, says=says)
    assert (tmp_path / "avg.pt").read_text() == EARLIER


# --- bench speed-table and vs-fairseq -------------------------------------------------------------------
SPEED_TABLE_CASES = {
    "checkpoint missing": ("--checkpoint", "missing", "no such checkpoint"),
    "checkpoint random bytes": ("--checkpoint", "garbage", "is not a PyTorch checkpoint"),
    "source missing": ("--source", "missing", "no such text file"),
    "source not UTF-8": ("--source", "utf8", ":2: invalid UTF-8"),
    "source empty": ("--source", "empty", "the text file is empty"),
    "json's folder missing": ("--json", "missing-folder", "does not exist"),
}


@pytest.mark.parametrize("case", SPEED_TABLE_CASES)
def test_speed_table_refuses_bad_input_before_timing(case, files, tmp_path, capsys):
    flag, kind, says = SPEED_TABLE_CASES[case]
    path = tmp_path / "no" / "t.json" if kind == "missing-folder" else files(kind)
    refused(["bench", "speed-table", "--sentences", "2", "--beams", "1", flag, path], capsys, says=says)


VS_FAIRSEQ_CASES = {
    "fairseq python missing": ("--fairseq-python", "missing", "no such program"),
    "fairseq python not executable": ("--fairseq-python", "text", "not executable"),
    "checkpoint missing": ("--checkpoint", "missing", "no such checkpoint"),
    "input missing": ("--input", "missing", "no such text file"),
    "input empty": ("--input", "empty", "the text file is empty"),
    "input not UTF-8": ("--input", "utf8", ":2: invalid UTF-8"),
}


@pytest.mark.parametrize("case", VS_FAIRSEQ_CASES)
def test_vs_fairseq_refuses_bad_input_before_timing(case, files, tmp_path, capsys):
    flag, kind, says = VS_FAIRSEQ_CASES[case]
    args = {"--fairseq-python": sys.executable, "--checkpoint": _checkpoint(), "--input": files("text")}
    args[flag] = files(kind)
    refused(["bench", "vs-fairseq", *[v for kv in args.items() for v in kv]], capsys, says=says)
