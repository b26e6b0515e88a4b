"""The command line as a whole: the benchmarks load only for `convs2s bench`, and bad input is one
line (``error: ...``) with exit code 2, never a traceback."""

import subprocess
import sys
import textwrap

import pytest

import convs2s
from convs2s.cli import main
from convs2s.dictionary import Dictionary
from convs2s.errors import Convs2sError


def _python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True)


def test_convs2s_imports_the_benchmarks_only_for_bench_commands(tmp_path):
    proc = _python(f"""
        import contextlib, io, sys
        import convs2s.cli
        convs2s.cli.build_parser()
        with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):
            convs2s.cli.main(["--help"])
        with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):
            convs2s.cli.main(["bench", "speed-table", "--help"])
        assert convs2s.cli.main(["translate", "--fairseq-checkpoint", {str(tmp_path / "none.pt")!r}]) == 2
        assert "convs2s_bench" not in sys.modules, sorted(m for m in sys.modules if m.startswith("convs2s_bench"))
        assert convs2s.cli.main(["bench", "compare", {str(tmp_path / "none.json")!r}]) == 2
        assert "convs2s_bench.cli" in sys.modules  # the bench command loaded it, when it ran
    """)
    assert proc.returncode == 0, proc.stderr
    assert "none.pt: no such checkpoint" in proc.stderr and "none.json is not a pytest-benchmark JSON file" in proc.stderr


def test_bench_errors_are_convs2s_errors():
    from convs2s_bench.compare import CompareError
    from convs2s_bench.speed_table import SpeedTableError
    from convs2s_bench.vs_fairseq import VsFairseqError

    assert all(issubclass(e, Convs2sError) for e in (SpeedTableError, VsFairseqError, CompareError))


@pytest.fixture
def checkpoint(tmp_path):
    """A small fconv checkpoint with its two dictionaries beside it."""
    vocab = Dictionary([f"w{i}" for i in range(60)])
    model = convs2s.build_model("fconv_iwslt_de_en", len(vocab), len(vocab))
    convs2s.save_fairseq(model, tmp_path / "model.pt", vocab, vocab)
    return tmp_path / "model.pt"


def test_a_malformed_dictionary_is_one_line_and_exit_code_2(checkpoint, tmp_path, capsys):
    (checkpoint.parent / "dict.src.txt").write_text("w0 1\na line without a count\n", encoding="utf-8")
    src = tmp_path / "src.txt"
    src.write_text("w1 w2\n", encoding="utf-8")
    rc = main(["translate", "--fairseq-checkpoint", str(checkpoint), "--input", str(src)])
    err = capsys.readouterr().err
    assert rc == 2
    assert err.splitlines() == [f"error: {checkpoint.parent / 'dict.src.txt'}:2: expected '<symbol> <count>', "
                                "got 'a line without a count'"]
    assert "Traceback" not in err


def test_a_malformed_dictionary_from_the_script_has_no_traceback(checkpoint, tmp_path):
    (checkpoint.parent / "dict.tgt.txt").write_text("w0 1\nw0 2\n", encoding="utf-8")
    src = tmp_path / "src.txt"
    src.write_text("w1 w2\n", encoding="utf-8")
    proc = subprocess.run([sys.executable, "-m", "convs2s", "translate", "--fairseq-checkpoint", str(checkpoint),
                           "--input", str(src)], capture_output=True, text=True)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.splitlines() == [f"error: {checkpoint.parent / 'dict.tgt.txt'}:2: duplicate symbol 'w0' "
                                        "(fairseq needs '#fairseq:overwrite' for that)"]


def test_train_refuses_an_unknown_backend_before_loading_data(tmp_path, capsys):
    rc = main(["train", str(tmp_path / "never-read"), "--save-dir", str(tmp_path / "s"),
               "--backend", "gpu9000"])
    err = capsys.readouterr().err
    assert rc == 2 and "Traceback" not in err  # after the one line saying which precision it would train in
    assert err.splitlines()[-1].startswith("error: unknown backend 'gpu9000'")


def test_vs_fairseq_refuses_a_json_path_without_a_folder_before_timing(tmp_path, capsys):
    rc = main(["bench", "vs-fairseq", "--fairseq-python", "never-run", "--checkpoint", "never-read.pt",
               "--input", "never-read.ids", "--json", str(tmp_path / "no" / "r.json")])
    assert rc == 2
    assert capsys.readouterr().err.splitlines() == [f"error: --json {tmp_path / 'no' / 'r.json'}: the folder "
                                                    f"{tmp_path / 'no'} does not exist"]


def test_a_strict_backend_from_the_environment_that_cannot_run_is_one_line(checkpoint, tmp_path, capsys, monkeypatch):
    """CONVS2S_KERNELS_BACKEND=triton on a CPU names one backend strictly: the op it cannot run is
    said in one line (with how to fall back), not a traceback mid-run."""
    monkeypatch.setenv("CONVS2S_KERNELS_BACKEND", "triton")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    src = tmp_path / "src.txt"
    src.write_text("w1 w2\n", encoding="utf-8")
    rc = main(["translate", "--fairseq-checkpoint", str(checkpoint), "--input", str(src)])
    err = capsys.readouterr().err
    assert rc == 2 and "Traceback" not in err and len(err.splitlines()) == 1
    assert err.startswith("error: backend 'triton' (from CONVS2S_KERNELS_BACKEND; a list such as 'triton,reference' "
                          "falls back) cannot run ")
