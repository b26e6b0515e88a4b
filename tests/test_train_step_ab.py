"""``bench/tools/train_step_ab.py``: training updates timed per backend on the same model and batches."""

import json

from harness import bench_script, require_or_skip


def test_updates_are_timed_per_backend_and_labelled_by_what_ran(tmp_path, capsys):
    require_or_skip("cpp")
    out = tmp_path / "ab.json"
    assert bench_script("train_step_ab").main(["--arch", "fconv_iwslt_de_en", "--vocab", "40", "--sentences", "2", "--length", "5",
                           "--rounds", "2", "--updates", "1", "--backends", "cpp,reference", "--precision", "fp32",
                           "--device", "cpu", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    rows = result["rows"]
    assert list(rows) == ["cpp", "reference"] and rows["reference"]["ratio_to_reference"] == 1.0
    for row in rows.values():
        assert len(row["rounds"]) == 2 and row["min"] <= row["tokens_per_s"] <= row["max"]
    assert "conv_glu (cpp)" in rows["cpp"]["ran"]  # the encoder's layers, forward (backward inside its autograd)
    assert rows["reference"]["ran"] and all(k.endswith("(reference)") for k in rows["reference"]["ran"])
    assert "target tok/s" in capsys.readouterr().out


def test_bad_options_are_named():
    import pytest

    with pytest.raises(SystemExit):
        bench_script("train_step_ab").main(["--backends", "triton"])
