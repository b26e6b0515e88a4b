"""The paper's speed table (`convs2s bench speed-table`, the README's main job) and `bench compare`."""

import json
from collections import Counter

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

import convs2s
from convs2s.cli import main
from convs2s_bench.flops import decoder_step_bytes, generation_flops
from convs2s_bench.speed_table import run
from convs2s_bench.workload import NEWSTEST_LENGTHS, synthetic_lengths

from conftest import SHARED, require_shared
from convs2s.engine import quantize_decoder_int8

TINY = ["--arch", "fconv_iwslt_de_en", "--vocab", "64", "--threads", "1"]


def test_embedded_lengths_follow_newstest():
    words = synthetic_lengths(NEWSTEST_LENGTHS)
    assert len(words) == 6003 and max(words) == 137
    assert abs(sum(words) / len(words) - 22.95) < 0.01
    lengths = synthetic_lengths()  # subwords, the unit the paper's model read
    assert len(lengths) == 6003 and sum(lengths) / sum(words) == pytest.approx(1.107, abs=5e-4)
    assert lengths != sorted(lengths) and lengths == synthetic_lengths()  # fixed shuffled order


def test_embedded_histogram_equals_the_shared_newstest_sources():
    folder = require_shared(SHARED / "data" / "newstest")
    counts = Counter(len(line.split()) for f in ("newstest2012.en", "newstest2013.en")
                     for line in (folder / f).read_text(encoding="utf-8").splitlines())
    assert dict(counts) == NEWSTEST_LENGTHS


@pytest.mark.parametrize("folded", [False, True], ids=["plain", "folded"])
def test_generation_flops_match_the_counted_matmuls(folded):
    """The counted work of either decoder (the folded one's is smaller: a fraction of peak from the
    plain count went above 1 for a folded decoder capped at AVX2)."""
    torch.manual_seed(0)
    model = convs2s.build_model("fconv_iwslt_de_en", 64, 64).fold_weight_norm().eval()
    sources = [torch.randint(4, 64, (9,)).tolist() for _ in range(3)]
    model.use_backend("reference")
    with FlopCounterMode(display=False) as counter:
        hyps = convs2s.generate(model, sources, beam=2, max_len_a=1.2, max_len_b=10, fold_attention=folded,
                                observer=convs2s.Observer(forced_length=[10] * 3))
    lengths = [len(h[0]["tokens"]) for h in hyps]
    assert lengths == [11] * 3
    estimate = generation_flops(model, [9] * 3, lengths, beam=2, folded=folded)
    counted = counter.get_total_flops()
    assert abs(estimate - counted) / counted < 0.05, (estimate, counted)
    if folded:
        assert estimate < generation_flops(model, [9] * 3, lengths, beam=2)


def test_speed_table_runs_every_available_backend(tmp_path, capsys):
    out_json = tmp_path / "table.json"
    rc = main(["bench", "speed-table", *TINY, "--sentences", "5", "--beams", "1,2", "--decoders", "plain,folded",
               "--repeats", "1", "--json", str(out_json)])
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
        assert 0 < r["fraction_of_gemm_peak"] < 1
        assert r["method"] == "measured" and r["model_uncertainty_s"] is None
        assert sum(r["dispatches"]["conv_step" if r["backend"] == "reference" or r["decoder"] == "plain"
                                   else "decoder_step"].values()) > 0
    assert result["machine"]["gemm_gflops_fp32"] > 0 and result["machine"]["isa"] is not None
    assert "| ConvS2S CPU 48 cores b=5 | 34.10 | 482 |" in out  # the paper's rows beside ours
    assert "first 5 of a fixed shuffled order" in out and "| vs reference | vs fp32 reference |" in out
    assert "not an estimate of the full set" in out


def test_default_estimates_the_full_set_from_a_sample(tmp_path, capsys):
    """The main job's default: the reference baseline and the fastest configuration, the full set's
    time estimated from a timed sample of its own batches, repeated, with the spread and the model
    uncertainty, the machine's instruction sets in the header, JSON and plot written."""
    out_json, plot = tmp_path / "t.json", tmp_path / "t.png"
    rc = main(["bench", "speed-table", *TINY, "--repeats", "2", "--json", str(out_json), "--plot", str(plot)])
    out = capsys.readouterr().out
    assert rc == 0
    result = json.loads(out_json.read_text())
    assert "partial" not in result and result["setup"]["mode"] == "estimate" and result["setup"]["batches"] == 119
    configs = {(r["backend"], r["decoder"], r["dtype"]) for r in result["rows"]}
    assert ("reference", "plain", "fp32") in configs and len(configs) == 2
    chosen = [r for r in result["rows"] if r["auto"]]
    assert {r["beam"] for r in chosen} == {1, 5} and all(r["decoder"] == "folded" for r in chosen)
    (name, choice), = result["setup"]["auto"].items()
    assert choice["choice"] == chosen[0]["dtype"] and f"(auto) {name}: chosen among fp32 and bf16" in out
    for r in result["rows"]:
        assert r["method"] == "estimate" and r["sentences"] == 6003 and r["repeats"] == 2
        assert len(r["seconds_per_repeat"]) == 2 and r["seconds_min"] <= r["seconds"] <= r["seconds_max"]
        assert r["model_uncertainty_s"] >= 0
        sample = r["per_repeat"][0]["sample"]
        assert {s["sentences"] for s in sample} >= {1, 128}
        assert all(len(s["step_s"]) <= 4 and s["modelled_s"] > 0 for s in sample)
    assert f"estimated from {result['setup']['sample_batches']} of them" in out and "Machine:" in out
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.fixture
def cpp_linear_up_to_8_rows():
    """cpp ``linear`` as a backend that cannot take every call: at most 8 rows (then restored)."""
    import torch

    from convs2s_kernels.dispatch import Capability, register
    from convs2s_kernels.ops.linear import cpp
    from convs2s_kernels.ops.linear.api import linear_tensors

    limited = Capability(dtypes={"cpu": (torch.float32, torch.bfloat16)}, rows=(1, 8), backward=False)
    register("cpp", "linear", cpp.linear_cpp, limited, linear_tensors)
    yield
    register("cpp", "linear", cpp.linear_cpp, cpp.CAPABILITY, linear_tensors)


def test_rows_are_labelled_by_what_ran(tmp_path, cpp_linear_up_to_8_rows):
    """With cpp ``linear`` limited to 8 rows, at beam 5 with two sentences its projections fall
    back to the reference, and the row says so (cpp*), with the calls counted per op. (One word a
    sentence: the encoder's linear layers take every source step, 2 x 2 rows.)"""
    import convs2s_kernels as ck

    if ck.available_backends()["cpp"] is not None:
        pytest.fail(f"the cpp backend is required here: {ck.available_backends()['cpp']}")
    src = tmp_path / "src.txt"
    src.write_text("two\nwords\n")
    result = run(arch="fconv_iwslt_de_en", vocab=64, source=str(src), mode="full", beams=[5, 1],
                 backends=["reference", "cpp"], decoders=["plain"], repeats=1, log=lambda m: None)
    rows = {(r["backend"], r["beam"]): r for r in result["rows"]}
    ref, cpp5, cpp1 = rows[("reference", 5)], rows[("cpp", 5)], rows[("cpp", 1)]
    assert ref["label"] == "reference" and ref["fell_back"] == {}
    assert set(ref["dispatches"]["linear"]) == {"reference"}
    assert cpp5["label"] == "cpp*" and cpp5["fell_back"]["linear"]["reference"] > 0  # 10 rows > 8
    assert cpp5["dispatches"]["conv_step"] == {"cpp": cpp5["dispatches"]["conv_step"]["cpp"]}
    assert cpp1["label"] == "cpp" and set(cpp1["dispatches"]["linear"]) == {"cpp"}  # 2 rows
    from convs2s_bench.speed_table import format_table

    table = format_table(result)
    assert "| cpp* | plain | fp32 | 5 |" in table and "| cpp | plain | fp32 | 1 |" in table
    assert "\\* cpp plain fp32 beam 5: some calls ran on another backend" in table and "linear: " in table


def test_full_runs_record_each_batch_and_save_progress(tmp_path):
    src = tmp_path / "src.txt"
    src.write_text("a b c\nd e f\ng h\ni j k l\n")
    partial = []
    result = run(arch="fconv_iwslt_de_en", vocab=64, source=str(src), mode="full", beams=[1, 2],
                 backends=["reference"], repeats=2, on_update=partial.append, log=lambda m: None)
    assert [len(p["rows"]) for p in partial] == [1, 2, 2, 2] and all(p["partial"] for p in partial)
    for r in result["rows"]:
        per_batch = [rep["batch_seconds"] for rep in r["per_repeat"]]
        assert len(per_batch) == 2 and all(len(b) == 3 for b in per_batch)  # lengths 2, 3, 4
        assert r["seconds_per_repeat"] == pytest.approx([sum(b) for b in per_batch])


def test_estimate_refuses_free_running_outputs(fixture_dir):
    from convs2s_bench.speed_table import SpeedTableError

    with pytest.raises(SpeedTableError, match="the estimate needs forced output lengths"):
        run(checkpoint=str(fixture_dir / "checkpoint.pt"), mode="estimate", log=lambda m: None)
    with pytest.raises(SpeedTableError, match="repeats must be at least 1"):
        run(arch="fconv_iwslt_de_en", vocab=64, repeats=0, log=lambda m: None)


def test_decoder_step_bytes_count_the_stored_dtype():
    torch.manual_seed(0)
    model = convs2s.build_model("fconv_iwslt_de_en", 64, 80).fold_weight_norm().eval()
    fp32 = decoder_step_bytes(model)
    weights = sum(p.numel() for n, p in model.decoder.named_parameters() if p.dim() >= 2 and "embed_" not in n)
    assert fp32 == 4 * weights
    quantize_decoder_int8(model, True)
    int8 = decoder_step_bytes(model)
    assert 0.25 * fp32 < int8 < 0.3 * fp32  # int8 plus a float32 scale per row
    quantize_decoder_int8(model, False)
    fc3 = model.decoder.fc3.weight.numel()
    assert decoder_step_bytes(model, vocab_rows=8) == fp32 - 4 * fc3 + 4 * fc3 * 8 // 80


def test_speed_table_reads_a_source_file_and_bf16(tmp_path, capsys):
    src = tmp_path / "src.txt"
    src.write_text("a tokenised sentence .\nanother one here , longer than the first one .\nshort\n")
    rc = main(["bench", "speed-table", *TINY, "--source", str(src), "--full", "--beams", "1", "--repeats", "1",
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
               "--repeats", "1",
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
    assert main(["bench", "speed-table", *TINY, "--device", "gpu9000"]) == 2
    assert capsys.readouterr().err.splitlines() == ["error: unknown --device 'gpu9000'; use cpu or cuda"]
    for flag in ("--json", "--plot"):  # refused before any timing, not after
        assert main(["bench", "speed-table", *TINY, flag, str(tmp_path / "no" / "t.out")]) == 2
        assert capsys.readouterr().err.splitlines() == [f"error: {flag} {tmp_path / 'no' / 't.out'}: the folder "
                                                        f"{tmp_path / 'no'} does not exist"]
        assert main(["bench", "speed-table", *TINY, flag, str(tmp_path)]) == 2
        assert capsys.readouterr().err.splitlines() == [f"error: {flag} {tmp_path} is a folder; name a file"]


def test_a_row_above_the_peak_is_kept_marked_and_fails_the_command(tmp_path, capsys, monkeypatch):
    """A rate above the measured GEMM peak is a miscount: the table is still printed and saved
    (the timings stand), the row marked, and then the command fails in one line."""
    from convs2s_bench import roofline

    measure = roofline.measure_peaks
    monkeypatch.setattr(roofline, "measure_peaks", lambda *a, **k: dict(measure(*a, **k), gemm_gflops_fp32=1e-6))
    out_json = tmp_path / "t.json"
    rc = main(["bench", "speed-table", *TINY, "--sentences", "2", "--beams", "1", "--repeats", "1",
               "--backends", "reference", "--json", str(out_json)])
    captured = capsys.readouterr()
    assert rc == 2 and "| ! above peak |" in captured.out and "! reference plain fp32 beam 1: fraction_of_gemm_peak" in captured.out
    assert captured.err.splitlines()[-1] == ("error: reference plain fp32 beam 1 ran above the measured GEMM peak "
                                             "(rows marked '!'): the work is miscounted or the peak under-measured")
    row, = json.loads(out_json.read_text())["rows"]
    assert row["fraction_of_gemm_peak"] is None and "> 1" in row["accounting_error"] and row["seconds"] > 0


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
    assert "| step N5 | CPU A (2 thr) | reference | 4.000 | 1.000 | 4.00x |" in out
    assert "| step N5 | CPU B (2 thr) | reference | 3.000 | 2.000 | 1.50x |" in out
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    assert main(["bench", "compare", str(bad)]) == 2
    assert "not a pytest-benchmark JSON file" in capsys.readouterr().err


def test_bench_compare_holds_int8_against_the_fp32_weights(tmp_path, capsys):
    """int8 speedups are over the float32 product they replace, not over the int8 reference
    (which dequantises on every call)."""
    a = _bench_file(tmp_path / "a.json", "CPU A", {("linear_int8 M1", "fp32-weights"): 0.004,
                                                  ("linear_int8 M1", "reference"): 0.040,
                                                  ("linear_int8 M1", "cpp"): 0.001})
    assert main(["bench", "compare", a]) == 0
    out = capsys.readouterr().out
    assert "| linear_int8 M1 | CPU A (2 thr) | fp32-weights | 4.000 | 40.000 | 1.000 | 4.00x |" in out


def test_fractions_of_peak_above_one_are_a_bug():
    from convs2s_bench.roofline import RooflineError, fractions_of_peak

    ok = fractions_of_peak(gflops_per_s=50.0, gb_per_s=10.0, gemm_gflops=100.0, copy_gbps=20.0)
    assert ok == {"fraction_of_gemm_peak": 0.5, "fraction_of_copy_bandwidth": 0.5}
    with pytest.raises(RooflineError, match="fraction_of_copy_bandwidth = 1.47 > 1"):
        fractions_of_peak(gflops_per_s=50.0, gb_per_s=29.4, gemm_gflops=100.0, copy_gbps=20.0)
    with pytest.raises(RooflineError, match="fraction_of_gemm_peak"):
        fractions_of_peak(gflops_per_s=101.0, gb_per_s=1.0, gemm_gflops=100.0)


@pytest.mark.parametrize("dtype,activation_bits,weight_bits", [("int7", 7, 8), ("w7a7", 7, 7)])
def test_speed_table_int8_dtypes_quantise_as_named(dtype, activation_bits, weight_bits):
    """int7 and w7a7 rows decode with the decoder quantised to those widths, on a copy of the model."""
    from convs2s.model import build_model
    from convs2s.engine.shapes import step_weight_modules
    from convs2s_bench.speed_table import Config, Models

    base = build_model("fconv_iwslt_de_en", 64, 64).eval()
    model = Models(base, torch.device("cpu")).get(Config("reference", "plain", dtype))
    from convs2s.engine import prepare

    layers = [prepare(model).derived(m) for m in step_weight_modules(model.decoder)]
    assert layers and all(m.use_int8 for m in layers)
    assert {(m.int8_activation_bits, m.int8_weight_bits) for m in layers} == {(activation_bits, weight_bits)}
    top = max(m.int8_weight()[0].abs().max().item() for m in layers)
    assert top == (1 << (weight_bits - 1)) - 1  # per-row scales reach the top of the width
    assert not any(prepare(base).derived(m).use_int8 for m in step_weight_modules(base.decoder))  # a copy


def test_speed_table_times_w7a7_rows(tmp_path, capsys):
    rc = main(["bench", "speed-table", *TINY, "--sentences", "4", "--beams", "1", "--repeats", "1",
               "--backends", "cpp", "--dtype", "w7a7", "--json", str(tmp_path / "t.json")])
    assert rc == 0, capsys.readouterr().err
    result = json.loads((tmp_path / "t.json").read_text())
    assert [(r["backend"], r["dtype"]) for r in result["rows"]] == [("cpp", "w7a7")]
    assert result["machine"]["gemm_gflops_w7a7"] > 0  # the row's peak, measured in the run


def test_auto_is_resolved_on_the_model_by_the_measured_choice():
    """The default row's dtype is what the measured choice says, never a flag: a faked choice of
    bf16 gives a bf16 row, of fp32 an fp32 row; rows asked for by name are left alone."""
    from convs2s.compute_type import Choice
    from convs2s_bench.speed_table import resolve_auto
    from convs2s_bench.workload import REFERENCE, Config

    model = convs2s.build_model("fconv_iwslt_de_en", 64, 64).eval()
    asked = []
    for name in ("bf16", "fp32"):
        def choose(m, compute_type, **kw):
            asked.append((compute_type, kw["beam"], kw["fold_attention"], m.backend))
            return Choice(name, {"fp32": [1.0], "bf16": [1.0]}, "faked")

        configs, chosen = resolve_auto([REFERENCE, Config("cpp", "folded", "auto")], model, torch.device("cpu"),
                                       [1, 5], log=lambda m: None, choose=choose)
        assert configs == [REFERENCE, Config("cpp", "folded", name)]
        assert chosen == {f"cpp folded {name}": dict(choice=name, why="faked", cached=False,
                                                     seconds={"fp32": [1.0], "bf16": [1.0]})}
        assert model.backend is None  # restored
    assert asked == [("auto", 5, True, "cpp,reference")] * 2
    from convs2s_bench.speed_table import SpeedTableError

    with pytest.raises(SpeedTableError, match="auto chose int7e .* which the speed table does not time"):
        resolve_auto([Config("cpp", "folded", "auto")], model, torch.device("cpu"), [1], log=lambda m: None,
                     choose=lambda m, t, **kw: Choice("int7e", {}, "CONVS2S_COMPUTE_TYPE=int7e"))


def _row(backend, dtype, beam, seconds, spread, auto=False):
    return dict(backend=backend, decoder="plain" if backend == "reference" else "folded", dtype=dtype, beam=beam,
                seconds=seconds, seconds_min=seconds - spread / 2, seconds_max=seconds + spread / 2, auto=auto)


def test_a_chosen_row_slower_than_the_reference_beyond_its_spread_fails_the_table():
    from convs2s_bench.speed_table import auto_losses

    rows = [_row("reference", "fp32", 1, 515, 4), _row("reference", "fp32", 5, 1203, 8),
            _row("cpp", "bf16", 1, 469, 6, auto=True), _row("cpp", "bf16", 5, 1419, 10, auto=True)]
    lost = auto_losses(dict(rows=rows))  # issue 48's Xeon: bf16 0.85x the reference at beam 5
    assert len(lost) == 1 and lost[0].startswith("cpp folded bf16 beam 5 (1,419.0 s against the reference's 1,203.0 s")
    rows[3] = _row("cpp", "bf16", 5, 1208, 10, auto=True)  # within its spread: not a loss
    assert auto_losses(dict(rows=rows)) == []
    rows[3] = _row("cpp", "bf16", 5, 1419, 10, auto=False)  # asked for by name: the user's choice
    assert auto_losses(dict(rows=rows)) == []


def test_the_speed_table_fails_in_one_line_when_auto_lost(monkeypatch, tmp_path, capsys):
    import convs2s_bench.speed_table as st

    def lost_run(request, **kw):
        return dict(rows=[_row("reference", "fp32", 1, 1.0, 0.01), _row("cpp", "bf16", 1, 2.0, 0.01, auto=True)],
                    machine={}, setup={})

    monkeypatch.setattr(st, "run", lost_run)
    monkeypatch.setattr(st, "format_table", lambda result: "the table")
    out_json = tmp_path / "t.json"
    assert main(["bench", "speed-table", *TINY, "--json", str(out_json)]) == 2
    captured = capsys.readouterr()
    assert "the table" in captured.out and out_json.is_file()  # printed and saved first
    err = captured.err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: auto's choice lost to the reference: cpp folded bf16 beam 1")
