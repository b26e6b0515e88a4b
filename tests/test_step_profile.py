"""The step profile (convs2s_bench.step_profile): rows as sentences x beam, the bound's bytes and
FLOPs from the model's own weights, and a table with one line per row count."""

import pytest

from convs2s.model import build_model
from convs2s_bench import step_profile
from convs2s.engine import prepare, quantize_decoder_int8


def test_rows_split_into_sentences_and_beam():
    assert step_profile.sentences_and_beam(1) == (1, 1)
    assert step_profile.sentences_and_beam(12) == (3, 4)
    assert step_profile.sentences_and_beam(160) == (32, 5)
    assert step_profile.sentences_and_beam(7) == (7, 1)


def test_bound_counts_every_step_weight_once_and_each_rows_products():
    model = build_model("fconv_iwslt_de_en", 50, 60).fold_weight_norm().eval()
    d = model.decoder
    weights = [d.fc1.weight, *[p.weight for p in d.projections if p is not None],
               *[c.weight for c in d.convolutions], d.fc2.weight, d.fc3.weight]
    n = sum(w.numel() for w in weights)
    bytes_, flops = step_profile.step_bounds(model, rows=3, src_len=5)
    assert bytes_ == 4 * n
    attention = sum(2 * 3 * 2 * 5 * c.out_channels // 2 for c, a in zip(d.convolutions, d.attention) if a is not None)
    assert flops == pytest.approx(2 * 3 * n + attention)


def test_int8_bound_counts_the_int8_weights_and_their_scales():
    model = build_model("fconv_iwslt_de_en", 50, 60).fold_weight_norm().eval()
    fp32_bytes, fp32_flops = step_profile.step_bounds(model, rows=3, src_len=5)
    quantize_decoder_int8(model)
    d = model.decoder
    modules = [d.fc1, *[p for p in d.projections if p is not None], *d.convolutions, d.fc2, d.fc3]
    n = sum(prepare(model).derived(m).int8_weight()[0].numel() for m in modules)
    scales = sum(prepare(model).derived(m).int8_weight()[1].numel() for m in modules)
    bytes_, flops = step_profile.step_bounds(model, rows=3, src_len=5)
    assert bytes_ == n + 4 * scales and n * 4 == fp32_bytes
    assert flops == fp32_flops, "the same products, in int8"


def test_int8_profile_holds_the_step_against_the_int8_peak(monkeypatch):
    monkeypatch.setattr(step_profile, "copy_peak_gbps", lambda megabytes: 10.0)
    monkeypatch.setattr(step_profile, "gemm_peak_gflops", lambda: 100.0)
    monkeypatch.setattr(step_profile, "int8_gemm_peak_gops", lambda **_: 400.0)
    result = step_profile.run("fconv_iwslt_de_en", [2], src_len=5, vocab=64, int8=True)
    text = step_profile.format_profile(result)
    assert "int8 decoder weights and activations" in text and "int8 400 GOP/s" in text
    from convs2s_kernels.extension import int8_kernel_isa

    assert result["kernels_isa"] == int8_kernel_isa(), "the int8 profile names the int8 kernel, not the float one"


def test_profile_table_has_a_line_per_row_count(monkeypatch):
    sizes = []
    monkeypatch.setattr(step_profile, "copy_peak_gbps", lambda megabytes: sizes.append(megabytes) or 10.0)
    monkeypatch.setattr(step_profile, "gemm_peak_gflops", lambda: 100.0)
    result = step_profile.run("fconv_iwslt_de_en", [1, 4], src_len=5, vocab=64)
    assert [r["rows"] for r in result["rows"]] == [1, 4]
    assert all(r["step_s"] > 0 and r["ops_ms"] and 0 < r["seen"] <= 1 for r in result["rows"])
    text = step_profile.format_profile(result)
    assert "| 1 |" in text and "| 4 |" in text and "copy 10.0 GB/s" in text
    weight_bytes = round(result["weight_mb"] * 1e6)
    assert sizes == [max(1, weight_bytes // 2 // (1 << 20))]  # the copy touches as many bytes as the step's weights


def test_paired_bound_holds_each_step_against_the_limits_sampled_around_it():
    """Each step against the bound of the better of the samples right before and right after it:
    max(bytes / copy, FLOPs / compute), the median of the ratios, their range, and the steps that
    beat both samples counted."""
    rec = dict(bytes=2e9, flops=1e9, step_times=[0.2, 0.3, 0.05],
               limits=[(10.0, 100.0), (20.0, 5.0), (20.0, None), (5.0, None)])
    # around step 0: (20, 100) -> max(0.1, 0.01) = 0.1 s; step 1: (20, 5) -> max(0.1, 0.2) = 0.2 s
    # (compute-bound); step 2: (20, no compute limit) -> 0.1 s, beaten (0.5x)
    paired = step_profile.paired_bounds(rec)
    assert paired["ratio"] == pytest.approx(1.5) and paired["ratio_range"] == pytest.approx((0.5, 2.0))
    assert paired["bound_ms"] == pytest.approx(100.0)
    assert (paired["below_one"], paired["steps"]) == (1, 3)
    assert step_profile.paired_bounds(dict(bytes=1, flops=1)) is None


def _result(step_s, seen, limits=()):
    row = dict(rows=3, step_s=step_s, step_range=(step_s, step_s), ops_ms={"op": 1.0}, profiled_step_s=step_s,
               seen=seen, step_times=[step_s], limits=list(limits), bytes=1e9, flops=1e9)
    return dict(arch="a", src_len=5, machine=dict(cpu="c", threads=2, isa=["AVX2"], isa_caps=None),
                kernels_isa="avx2", copy_gbps=10.0, gemm_gflops=100.0, weight_mb=1000.0, rows=[row])


def test_the_profile_refuses_a_step_below_the_best_limits_of_its_run():
    """The unpaired bound takes the best limits measured anywhere in the run (the start's and every
    sample's): a median step under it is a miscount, said under the table."""
    good = _result(0.2, 0.9)
    text = step_profile.format_profile(good)  # bound max(1e9 / 10e9, 1e9 / 100e9) = 0.1 s
    assert "| 3 | 200.00 (200.00-200.00) | 100.00 | 2.00x |" in text and "!" not in text
    assert step_profile.miscounts(good) == []
    faster_sample = [(20.0, 100.0), (5.0, 100.0)]  # one sample saw 20 GB/s: the bound falls to 0.05 s
    assert "| 50.00 | 4.00x |" in step_profile.format_profile(_result(0.2, 0.9, faster_sample))
    fast = _result(0.09, 0.9)
    assert step_profile.miscounts(fast) == ["3 rows: the median step (90.00 ms) beat the bound of the best limits "
                                            "measured in the run (100.00 ms): the bytes or FLOPs are miscounted"]
    assert "\n! 3 rows: the median step (90.00 ms) beat" in step_profile.format_profile(fast)


def test_the_profile_refuses_ops_longer_than_their_steps():
    assert ["101%" in m for m in step_profile.miscounts(_result(0.2, 1.01))] == [True]


def test_a_refused_profile_is_still_written_and_exits_2(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(step_profile, "run", lambda *a, **k: _result(0.09, 0.9))
    out = tmp_path / "p.md"
    assert step_profile.main(["--rows", "3", "--out", str(out)]) == 2
    assert "| 3 | 90.00" in out.read_text() and "! 3 rows" in out.read_text()
    err = capsys.readouterr().err
    assert err.splitlines()[-1].startswith("error: the profile is refused ('!' under its table): 3 rows: the median")


def test_the_share_counts_the_stepping_thread_only():
    """Self times of the thread that ran the profiled steps, the range around them left out; a
    worker thread's ops overlap that thread's time and are not added."""
    from types import SimpleNamespace as E

    events = [E(name=step_profile.PROFILED_RANGE, thread=1, self_cpu_time_total=300.0),
              E(name="aten::mm", thread=1, self_cpu_time_total=500.0),
              E(name="aten::mm", thread=1, self_cpu_time_total=100.0),
              E(name="aten::add", thread=1, self_cpu_time_total=50.0),
              E(name="aten::mm", thread=7, self_cpu_time_total=900.0)]
    assert step_profile.stepping_thread_ops(events) == {"aten::mm": 600.0, "aten::add": 50.0}


@pytest.mark.parametrize("int8", [False, True])
def test_the_sampler_measures_plausible_limits(int8):
    from convs2s_bench.roofline import LimitSampler

    sampler = LimitSampler(4, int8=int8, fallback_compute=123.0)
    for _ in range(2):  # the int8 product's operands are made once, used by every sample
        copy, compute = sampler.sample()
        assert 0.1 < copy < 10000 and compute is not None and compute > 0


def test_bad_rows_name_the_problem(capsys):
    with pytest.raises(SystemExit) as exit_:
        step_profile.main(["--rows", "0,x"])
    assert exit_.value.code == 2 and "--rows must be positive integers" in capsys.readouterr().err


def test_search_overhead_splits_each_step_into_ops_and_python(tmp_path):
    """Every decoding step is counted once (forced lengths: L + 1 steps per batch, EOS included),
    and the Python share is what the profiled step spends outside ops."""
    from convs2s_bench import search_overhead

    ids = tmp_path / "src.ids"
    ids.write_text("5 6 7\n8 9 10\n11 12\n13 14 15 16\n")
    model = build_model("fconv_iwslt_de_en", 40, 40, encoder_layers="[(32, 3)]", decoder_layers="[(32, 3)] * 2",
                        encoder_embed_dim=16, decoder_embed_dim=16, decoder_out_embed_dim=16).fold_weight_norm().eval()
    rec = search_overhead.measure(model, search_overhead.read_ids(str(ids)), beam=2, repeats=1)
    # batches of lengths 2, 3 (two sentences), 4: forced to round(1.1 L) words, then EOS
    assert rec["batches"] == 3 and rec["steps"] == (2 + 1) + (3 + 1) + (4 + 1)
    assert 0 < rec["inside_ops_step_ms"] < rec["profiled_step_ms"]
    assert rec["python_step_ms"] == pytest.approx(rec["profiled_step_ms"] - rec["inside_ops_step_ms"])
    text = search_overhead.format_result("tiny", [rec])
    assert text.count("\n| 2 | 3 | 12 |") == 1


def test_search_overhead_bad_input_names_the_problem(tmp_path, capsys):
    from convs2s_bench import search_overhead

    for argv, message in ((["--input", "x", "--beams", "5,0"], "--beams must be positive integers"),
                          (["--input", str(tmp_path / "missing.ids"), "--vocab", "20"], "cannot read sentence ids")):
        with pytest.raises(SystemExit) as exit_:
            search_overhead.main(argv)
        assert exit_.value.code == 2 and message in capsys.readouterr().err
