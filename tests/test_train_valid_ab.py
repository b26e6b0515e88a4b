"""``bench/tools/train_valid_ab.py``: training recipes side by side at equal wall time, judged on validation."""

import json
import math
from pathlib import Path

import pytest

from harness import bench_script
from test_train import TINY, make_copy_data

SHARED = ["--arch", "fconv", "--log-interval", "1", "--lr", "0.25", "--clip-norm", "0.1", "--min-lr", "0",  # only the clock stops
          *[f"--model-option={k}={v}" for k, v in TINY.items()]]


def test_arms_train_at_once_for_the_same_minutes_and_report_the_final_validation(tmp_path, capsys):
    data = make_copy_data(tmp_path / "bin", 200)
    out = tmp_path / "ab.json"
    assert bench_script("train_valid_ab").main([data, "--minutes", "0.1", "--decay-minutes", "0.05", "--work", str(tmp_path / "w"),
                           "--arm", "--max-tokens 150 --validate-interval 4", "--arm", "--max-tokens 300",
                           "--json", str(out), "--", *SHARED]) == 0
    result = json.loads(out.read_text())
    assert [a["arm"] for a in result["arms"]] == ["--max-tokens 150 --validate-interval 4", "--max-tokens 300"]
    for arm in result["arms"]:
        assert "--max-time 0.1" in arm["reason"] and arm["updates"] > 0
        assert math.isfinite(arm["final_valid_ppl"]) and arm["final_valid_ppl"] > 1.0
        assert arm["tokens_per_s"] > 0
        log = [json.loads(line) for line in Path(arm["save_dir"], "train_log.jsonl").read_text().splitlines()]
        assert {r["kind"] for r in log} >= {"train"} and max(r["train_minutes"] for r in log if "train_minutes" in r) >= 0.1
    small = result["arms"][0]
    assert small["valid"] and all(v["update"] % 4 == 0 for v in small["valid"])  # the arm's own options apply
    table = capsys.readouterr().out
    assert "| `--max-tokens 300` |" in table and "final ppl" in table


def test_bad_requests_are_one_line_errors(tmp_path, capsys):
    data = make_copy_data(tmp_path / "bin", 20)
    with pytest.raises(SystemExit):
        bench_script("train_valid_ab").main([data, "--arm", "--max-tokens 100"])  # one arm compares nothing
    with pytest.raises(SystemExit):
        bench_script("train_valid_ab").main([str(tmp_path / "nothing"), "--arm", "a", "--arm", "b"])
    with pytest.raises(SystemExit):
        bench_script("train_valid_ab").main([data, "--arm", "a", "--arm", "b", "--minutes", "1", "--decay-minutes", "2"])
    assert "--decay-minutes" in capsys.readouterr().err
    assert bench_script("train_valid_ab").main([data, "--minutes", "0.01", "--decay-minutes", "0.01", "--work", str(tmp_path / "w"),
                           "--arm", "--max-tokens 100", "--arm", "--arch no_such_arch", "--", *SHARED]) == 1
    assert "error: arm '--arch no_such_arch' failed" in capsys.readouterr().err
