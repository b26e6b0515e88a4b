"""The README's main job (`python -m convs2s demo`), at a tiny scale, and its option checks."""

import pytest

from convs2s.cli import main


def test_demo_runs_every_available_backend(capsys):
    rc = main(["demo", "--arch", "fconv_iwslt_de_en", "--vocab", "50", "--sentences", "3", "--lengths", "4,6",
               "--beams", "1,2", "--backends", "reference,cpp,triton"])
    out = capsys.readouterr().out
    assert rc == 0
    rows = [l.split() for l in out.splitlines() if l.startswith(("reference ", "cpp ", "triton "))]
    timed = [r for r in rows if r[1] != "skipped:"]
    assert {(r[0], r[1]) for r in timed} >= {("reference", "1"), ("reference", "2")}
    for r in timed:
        assert float(r[2]) > 0 and float(r[4]) > 0  # seconds and tokens/s
    assert any(r[0] == "triton" and r[1] == "skipped:" for r in rows) or any(r[0] == "triton" for r in timed)


def test_demo_rejects_unknown_backend_and_bad_lists(capsys):
    assert main(["demo", "--arch", "fconv_iwslt_de_en", "--vocab", "50", "--backends", "gpu9000"]) == 2
    assert "unknown backend 'gpu9000'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["demo", "--beams", "0"])
