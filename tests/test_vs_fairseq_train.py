"""`convs2s bench vs-fairseq-train`: fairseq's training updates beside convs2s's.

With a fairseq interpreter at hand (``CONVS2S_FAIRSEQ_PYTHON``, or the peer venv
``../shared/peers/setup_fsq_venv.sh`` builds at ``~/.cache/fsq-venv``), a small model trains on
both sides on the CPU and the first losses must be equal. fairseq is not a dependency, so the
plumbing (the request, the interleaving, the report, the refusal when the losses differ) is also
tested against a stand-in interpreter that answers from convs2s's own Trainer."""

import json
import operator
import os
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from torch._dynamo import lookup_backend, register_backend

from convs2s.cli import main
from convs2s_bench.vs_fairseq_train import REFERENCE_EAGER, TrainRequest, compare, format_result, losses_agree

FAIRSEQ_PYTHON = os.environ.get("CONVS2S_FAIRSEQ_PYTHON", str(Path.home() / ".cache/fsq-venv/bin/python"))
SMALL = dict(arch="fconv_iwslt_de_en", max_tokens=300, updates=2, warmup=1, repeats=2, check_updates=2, vocab=60,
             threads=1)

STAND_IN = textwrap.dedent('''
    import json, os, sys
    driver, request, result = sys.argv[1:]
    assert os.path.basename(driver) == "fairseq_train_driver.py" and os.path.exists(driver)
    req = json.load(open(request))
    with open(os.environ["FAKE_FAIRSEQ_LOG"], "a") as f:
        f.write(json.dumps({k: req.get(k) for k in ("dropout", "warmup", "batches", "threads", "lr", "clip_norm",
                                                    "compile")}) + "\\n")
    import torch
    if req.get("compile"):  # fairseq's model under inductor, as it fails on torch 2.13
        json.dump(dict(fairseq="stand-in", torch=torch.__version__, threads=req["threads"], seconds=None, losses=[],
                       gnorms=[], warmup=req["warmup"], parameters=0, compile=req["compile"],
                       error="InductorError: LoweringException: ValueError: Cannot view a tensor"), open(result, "w"))
        sys.exit(0)
    from convs2s_bench.vs_fairseq_train import TrainRequest, run_convs2s
    from convs2s.fairseq_io import read_checkpoint
    initial = read_checkpoint(os.path.join(req["folder"], "model.pt"))["model"]
    r = TrainRequest(fairseq_python="-", arch=req["arch"], max_tokens=req["max_tokens"], lr=req["lr"],
                     momentum=req["momentum"], clip_norm=req["clip_norm"], label_smoothing=req["label_smoothing"],
                     seed=req["seed"], threads=req["threads"])
    out = run_convs2s(r, req["folder"], req["batches"], initial, req["dropout"], req["warmup"])
    if os.environ.get("FAKE_FAIRSEQ_DIFFER"):
        out["losses"][0] *= 1.01
    json.dump(dict(fairseq="stand-in", torch=torch.__version__, threads=req["threads"], seconds=out["seconds"],
                   losses=out["losses"], gnorms=out["gnorms"], warmup=req["warmup"], parameters=0), open(result, "w"))
''')


@pytest.fixture
def stand_in(fake_fairseq):
    return fake_fairseq(STAND_IN)


def test_the_command_times_both_interleaved_and_compares_the_losses(stand_in, tmp_path, capsys, monkeypatch):
    python, log = stand_in
    out_json = tmp_path / "train.json"
    import convs2s.atomic

    written, write = [], convs2s.atomic.atomic_write_text
    def recording(path, text, *args, **kwargs):
        if str(path) == str(out_json):
            written.append(json.loads(text))
        return write(path, text, *args, **kwargs)

    monkeypatch.setattr(convs2s.atomic, "atomic_write_text", recording)
    rc = main(["bench", "vs-fairseq-train", "--fairseq-python", str(python), "--max-tokens", "300", "--updates", "2",
               "--warmup", "1", "--repeats", "2", "--check-updates", "2", "--vocab", "60", "--threads", "1",
               "--compile-modes", "none", "--json", str(out_json)])
    out = capsys.readouterr().out
    assert rc == 0
    requests = [json.loads(line) for line in log.read_text().splitlines()]
    # the loss check (dropout 0, no warm-up), then one timed pass per repeat
    assert [(r["dropout"], r["warmup"]) for r in requests] == [(0.0, 0), (0.2, 1), (0.2, 1)]
    assert len(requests[0]["batches"]) == 2 and requests[1]["batches"] == requests[2]["batches"]
    assert all(r["threads"] == 1 and r["lr"] == 0.25 and r["clip_norm"] == 0.1 for r in requests)
    result = json.loads(out_json.read_text())
    assert result["losses"]["max_relative_difference"] < 1e-5, result["losses"]
    assert len(result["rows"]["fairseq"]["seconds"]) == len(result["rows"]["convs2s"]["seconds"]) == 2
    assert result["setup"]["flops_per_target_token"] > 0 and 0 < result["rows"]["convs2s"]["fraction_of_gemm_peak"] < 1
    assert any(k.startswith("conv_glu") for k in result["ran"])
    # the products convs2s ran: fewer than the model's exactly where Winograd tiles served its convolutions
    winograd = any("winograd" in k for k in result["ran"])
    run, model = result["setup"]["convs2s_run_flops_per_target_token"], result["setup"]["flops_per_target_token"]
    assert (run < model) if winograd else (run == model)
    assert result["ceiling"] == pytest.approx(result["gemm_peak_gflops"] * 1e9 / run
                                              / result["rows"]["fairseq"]["tokens_per_s"])
    assert "convs2s / fairseq:" in out and "MFLOP per target token" in out
    assert f"every product convs2s runs at the peak would be {result['ceiling']:.2f}x" in out
    # --json kept each repeat as it ended, then the whole result
    assert [len(r["rows"]["convs2s"]["seconds"]) for r in written] == [1, 2, 2] and written[-1] == result
    assert set(result["rows"]) == {"fairseq", "convs2s"} and "compiled" not in result  # --compile-modes none


def test_losses_that_differ_fail_the_command(stand_in, monkeypatch, capsys):
    python, _ = stand_in
    monkeypatch.setenv("FAKE_FAIRSEQ_DIFFER", "1")
    rc = main(["bench", "vs-fairseq-train", "--fairseq-python", str(python), "--max-tokens", "300", "--updates", "1",
               "--warmup", "0", "--repeats", "1", "--check-updates", "1", "--vocab", "60", "--threads", "1",
               "--compile-modes", "none"])
    err = capsys.readouterr().err
    assert rc == 2 and "the first losses differ by 9.9e-03" in err


def test_bad_options_are_one_line_errors(tmp_path, capsys):
    rc = main(["bench", "vs-fairseq-train", "--fairseq-python", str(tmp_path / "missing")])
    assert rc == 2 and "--fairseq-python" in capsys.readouterr().err
    python = tmp_path / "python"
    python.write_text("#!/bin/sh\nexit 1\n")
    python.chmod(0o755)
    rc = main(["bench", "vs-fairseq-train", "--fairseq-python", str(python), "--data", str(tmp_path)])
    err = capsys.readouterr().err
    assert rc == 2 and "not a convs2s data folder" in err and "Traceback" not in err
    rc = main(["bench", "vs-fairseq-train", "--fairseq-python", str(python), "--compile-modes", "default,fastest"])
    err = capsys.readouterr().err
    assert rc == 2 and "unknown torch.compile mode 'fastest'" in err and "Traceback" not in err


def _refusing_the_dropout_hash(gm, example_inputs):
    """A torch.compile backend that fails on the graphs holding the project's dropout hash (its
    bitwise ops), as inductor can on its 64-bit seed arithmetic, and runs the others as dynamo
    traced them (eager: fast, and the plumbing is what is tested)."""
    hashing = {operator.and_, operator.xor, torch.bitwise_and, torch.bitwise_xor}
    if any(node.target in hashing for node in gm.graph.nodes):
        raise RuntimeError("OverflowError: 18446744073709551615 too big to convert to int64_t")
    return lookup_backend("eager")(gm, example_inputs)


def _failing(gm, example_inputs):
    raise RuntimeError("LoweringException: every graph refused")


register_backend(_refusing_the_dropout_hash, name="test_vsft_refusing_the_dropout_hash")
register_backend(_failing, name="test_vsft_failing")


def test_compiled_rows_are_timed_beside_the_others_and_checked(stand_in):
    """The reference model eager and compiled beside fairseq and convs2s: the compiled one compiles
    untimed first and its first losses equal the eager reference's; where the model as it is fails
    to compile it is compiled again with the dropout op eager; fairseq's compiled model fails and
    that failure is its row, not the run's end."""
    python, log = stand_in
    req = TrainRequest(fairseq_python=str(python), compile_modes=("default",),
                       compile_backend="test_vsft_refusing_the_dropout_hash", **SMALL)
    result = compare(req, log=lambda m: None)
    rows = result["rows"]
    assert list(rows) == ["fairseq", "convs2s", REFERENCE_EAGER, "reference compiled (default)",
                          "fairseq compiled (default)"]
    compiled = rows["reference compiled (default)"]
    assert len(compiled["seconds"]) == 2 and compiled["tokens_per_s"] > 0 and compiled["compile_s"] > 0
    assert compiled["compile_updates"] == 2 and compiled["graphs"] > 0 and compiled["graph_breaks"] > 0
    assert compiled["graphs_in_timed_pass"] == 0  # compiled before the timings, every shape
    assert compiled["dropout_eager"] and "OverflowError" in compiled["first_try_error"]
    assert compiled["losses_agree"] and compiled["max_relative_difference"] < 1e-5 and compiled["check_dropout"] == 0.2
    assert compiled["convs2s_speedup"]["median"] > 0 and rows[REFERENCE_EAGER]["convs2s_speedup"]["median"] > 0
    failed = rows["fairseq compiled (default)"]
    assert failed["tokens_per_s"] is None and failed["error"].startswith("InductorError: LoweringException")
    requests = [json.loads(line) for line in log.read_text().splitlines()]
    # fairseq's compiled model: checked at dropout 0, failed, never timed
    assert [(r["dropout"], r["compile"]) for r in requests] == [(0.0, None), (0.0, "default"), (0.2, None), (0.2, None)]
    assert result["compiled"]["best"] == "reference compiled (default)"
    assert result["compiled"]["convs2s_speedup"] == compiled["convs2s_speedup"]["median"]
    text = format_result(result)
    assert "| fairseq compiled (default) | failed |" in text and "best compiled row: reference compiled" in text
    assert "the model as it is failed (BackendCompilerFailed" in text


def test_a_model_that_fails_to_compile_is_a_row_not_a_crash(stand_in, capsys):
    python, _ = stand_in
    rc = main(["bench", "vs-fairseq-train", "--fairseq-python", str(python), "--max-tokens", "300", "--updates", "1",
               "--warmup", "0", "--repeats", "1", "--check-updates", "1", "--vocab", "60", "--threads", "1",
               "--compile-modes", "default", "--no-compile-fairseq", "--compile-backend", "test_vsft_failing"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "| reference compiled (default) | failed |" in out and "LoweringException: every graph refused" in out
    assert "| reference eager |" in out and "no compiled row ran" in out and "fairseq compiled" not in out


@pytest.mark.skipif(not os.access(FAIRSEQ_PYTHON, os.X_OK), reason="no fairseq interpreter (CONVS2S_FAIRSEQ_PYTHON "
                    "or ../shared/peers/setup_fsq_venv.sh's ~/.cache/fsq-venv)")
def test_real_fairseq_trains_the_same_model():
    result = compare(TrainRequest(fairseq_python=FAIRSEQ_PYTHON, **SMALL), log=lambda m: None)
    assert result["setup"]["fairseq_version"] == "0.12.2"
    assert losses_agree(result, 1e-5), result["losses"]
    assert len(result["losses"]["fairseq"]) == 2 and result["losses"]["gnorm_fairseq"][0] > 0
    gn_ours, gn_theirs = result["losses"]["gnorm_convs2s"], result["losses"]["gnorm_fairseq"]
    assert all(abs(a - b) <= 1e-4 * b for a, b in zip(gn_ours, gn_theirs)), (gn_ours, gn_theirs)
