"""The paper's speed table (`convs2s bench speed-table`, the README's main job) and `bench compare`."""

import json
from collections import Counter

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

import convs2s
from convs2s.cli import main
from convs2s.speed_table import NEWSTEST_LENGTHS, generation_flops, synthetic_lengths

from conftest import SHARED, require_shared

TINY = ["--arch", "fconv_iwslt_de_en", "--vocab", "64", "--threads", "1"]


def test_embedded_lengths_follow_newstest():
    lengths = synthetic_lengths()
    assert len(lengths) == 6003 and max(lengths) == 137
    assert abs(sum(lengths) / len(lengths) - 22.95) < 0.01
    assert lengths != sorted(lengths) and lengths == synthetic_lengths()  # fixed shuffled order


def test_embedded_histogram_equals_the_shared_newstest_sources():
    folder = require_shared(SHARED / "data" / "newstest")
    counts = Counter(len(line.split()) for f in ("newstest2012.en", "newstest2013.en")
                     for line in (folder / f).read_text(encoding="utf-8").splitlines())
    assert dict(counts) == NEWSTEST_LENGTHS


def test_generation_flops_match_the_counted_matmuls():
    torch.manual_seed(0)
    model = convs2s.build_model("fconv_iwslt_de_en", 64, 64).fold_weight_norm().eval()
    sources = [torch.randint(4, 64, (9,)).tolist() for _ in range(3)]
    model.use_backend("reference")
    with FlopCounterMode(display=False) as counter:
        hyps = convs2s.generate(model, sources, beam=2, max_len_a=1.2, max_len_b=10, forced_length=[10] * 3)
    lengths = [len(h[0]["tokens"]) for h in hyps]
    assert lengths == [11] * 3
    estimate = generation_flops(model, [9] * 3, lengths, beam=2)
    counted = counter.get_total_flops()
    assert abs(estimate - counted) / counted < 0.05, (estimate, counted)


def test_speed_table_runs_every_available_backend(tmp_path, capsys):
    out_json = tmp_path / "table.json"
    rc = main(["bench", "speed-table", *TINY, "--sentences", "5", "--beams", "1,2", "--decoders", "plain,folded",
               "--json", str(out_json)])
    out = capsys.readouterr().out
    assert rc == 0
    result = json.loads(out_json.read_text())
    import convs2s_kernels as ck

    available = [b for b, why in ck.available_backends().items() if why is None and b != "triton"]
    assert {(r["backend"], r["decoder"], r["beam"]) for r in result["rows"]} == \
        {(b, d, k) for b in available for d in ("plain", "folded") for k in (1, 2)}
    lengths = synthetic_lengths()[:5]
    for r in result["rows"]:
        assert r["sentences"] == 5 and r["dtype"] == "fp32"
        assert r["target_tokens"] == sum(round(1.1 * L) + 1 for L in lengths)  # forced length, EOS included
        assert r["seconds"] > 0 and r["tokens_per_s"] == pytest.approx(r["target_tokens"] / r["seconds"])
        assert 0 < r["fraction_of_gemm_peak"] < 2
    assert result["machine"]["gemm_gflops_fp32"] > 0
    assert "| ConvS2S CPU 48 cores b=5 | 34.10 | 482 |" in out  # the paper's rows beside ours
    assert "first 5 of a fixed shuffled order" in out and "speedup vs reference" in out


def test_speed_table_reads_a_source_file_and_bf16(tmp_path, capsys):
    src = tmp_path / "src.txt"
    src.write_text("a tokenised sentence .\nanother one here , longer than the first one .\nshort\n")
    rc = main(["bench", "speed-table", *TINY, "--source", str(src), "--full", "--beams", "1",
               "--backends", "reference", "--dtype", "bf16,fp32", "--json", str(tmp_path / "t.json")])
    assert rc == 0, capsys.readouterr().err
    rows = json.loads((tmp_path / "t.json").read_text())["rows"]
    assert [r["dtype"] for r in rows] == ["fp32", "bf16"]
    assert all(r["sentences"] == 3 and r["source_tokens"] == 4 + 10 + 1 for r in rows)


def test_speed_table_with_a_checkpoint_reports_bleu(fixture_dir, tmp_path, capsys):
    lines = [" ".join(f"w{t}" for t in l.split()) for l in (fixture_dir / "source.ids").read_text().splitlines()]
    src = tmp_path / "src.txt"
    src.write_text("\n".join(lines) + "\n")
    rc = main(["bench", "speed-table", "--checkpoint", str(fixture_dir / "checkpoint.pt"), "--source", str(src),
               "--reference", str(src), "--full", "--beams", "1", "--backends", "reference", "--threads", "1",
               "--json", str(tmp_path / "t.json")])
    assert rc == 0, capsys.readouterr().err
    row = json.loads((tmp_path / "t.json").read_text())["rows"][0]
    assert row["sentences"] == len(lines) and 0.0 <= row["bleu"] <= 100.0


def test_speed_table_errors_name_the_problem(tmp_path, capsys):
    assert main(["bench", "speed-table", "--arch", "fconv_nope", "--threads", "1"]) == 2
    assert "unknown architecture 'fconv_nope'" in capsys.readouterr().err
    assert main(["bench", "speed-table", *TINY, "--source", str(tmp_path / "missing.txt")]) == 2
    assert "missing.txt" in capsys.readouterr().err
    assert main(["bench", "speed-table", *TINY, "--backends", "gpu9000"]) == 2
    assert "unknown backend 'gpu9000'" in capsys.readouterr().err
    assert main(["bench", "speed-table", *TINY, "--backends", "triton"]) == 2
    err = capsys.readouterr().err  # no GPU: either unavailable, or refused as the interpreter
    assert "backend 'triton' is not available here" in err or "backend 'triton' times GPUs only" in err
    assert main(["bench", "speed-table", *TINY, "--reference", str(tmp_path / "r.txt")]) == 2
    assert "--reference needs --checkpoint" in capsys.readouterr().err
    assert main(["bench", "speed-table", *TINY, "--dtype", "fp8"]) == 2
    assert "unknown dtype 'fp8'" in capsys.readouterr().err
    assert main(["bench", "speed-table", *TINY, "--decoders", "turbo"]) == 2
    assert "unknown decoder 'turbo'" in capsys.readouterr().err


def _bench_file(path, machine, medians):
    path.write_text(json.dumps({
        "machine_info": {"cpu_model": machine, "torch_threads": 2},
        "benchmarks": [{"group": g, "name": f"test[{b}]", "params": {"backend": b}, "stats": {"median": m}}
                       for (g, b), m in medians.items()],
    }))
    return str(path)


def test_bench_compare_pivots_machines_and_backends(tmp_path, capsys):
    a = _bench_file(tmp_path / "a.json", "CPU A", {("step N5", "reference"): 0.004, ("step N5", "cpp"): 0.001})
    b = _bench_file(tmp_path / "b.json", "CPU B", {("step N5", "reference"): 0.003, ("step N5", "cpp"): 0.002})
    assert main(["bench", "compare", a, b]) == 0
    out = capsys.readouterr().out
    assert "| step N5 | CPU A (2 thr) | 4.000 | 1.000 | 4.00x |" in out
    assert "| step N5 | CPU B (2 thr) | 3.000 | 2.000 | 1.50x |" in out
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    assert main(["bench", "compare", str(bad)]) == 2
    assert "not a pytest-benchmark JSON file" in capsys.readouterr().err
