"""Kernel choice by measurement (convs2s_kernels.tune): the rule that turns timings into row
counts, the per-machine cache (written atomically; corrupt or stale files ignored with a
warning), measuring only what is missing, CONVS2S_TUNE=0, the CLI, and the decoder asking for
exactly its step's weight shapes (and the encoder, translating, for its own)."""

import json
import subprocess
import sys

import pytest
import torch

import convs2s_kernels.tune as tune
import convs2s_kernels as ck
from convs2s_kernels.tune import candidate_calls, policy, rules, timing
from convs2s_kernels.tune.__main__ import main as tune_main
from convs2s_kernels import tune_cache
from convs2s_kernels.extension import native
from harness import require_or_skip

from convs2s.model import build_model
from convs2s.engine.shapes import encoder_weight_shapes, fold_weight_shapes, step_weight_shapes
from convs2s.engine import prepare, quantize_decoder_int8


@pytest.fixture
def fresh(tmp_path, monkeypatch):
    """An empty cache of our own and no choice in force, before and after."""
    require_or_skip("cpp")
    monkeypatch.setenv(tune_cache.DIR_ENV, str(tmp_path))
    tune.forget()
    yield tmp_path
    tune.forget()


def _fake_measure(calls):
    def measure(shape):
        calls.append(shape.name)
        return dict(timings={"1": [1.0, 2.0], "8": [3.0, 4.0], "12": [5.0, 4.0], "16": [9.0, 6.0]})
    return measure


def test_each_bucket_takes_its_winner_and_between_buckets_both_must_agree():
    t = {1: (1, 2), 2: (3, 2), 4: (1, 2), 8: (1, 2), 12: (3, 2)}  # kernel loses at 2 and 12
    rows = rules.kernel_rows(t, 16)
    assert [r for r, on in enumerate(rows, 1) if on] == [1, 4, 5, 6, 7, 8]
    assert rules.kernel_rows({}, 4) == [False] * 4
    assert rules.kernel_rows({1: (2, 1)}, 2) == [False, False]


def test_measure_times_both_candidates_until_the_kernel_loses(fresh):
    entry = timing.measure(tune.Shape("nk", "float32", 24, 40), buckets=(1, 2, 4))
    measured = list(entry["timings"])
    assert measured in (["1", "2"], ["1", "2", "4"])  # it stops only after two losses in a row
    assert all(len(v) == 2 and min(v) > 0 for v in entry["timings"].values())
    if native().onednn_gemm_available():  # and the GEMM libraries against each other, first
        assert sorted(entry["library"], key=int) == [str(r) for r in rules.LIBRARY_ROWS]
        assert all(len(v) == 2 and min(v) > 0 for v in entry["library"].values())


def test_the_library_rule_gives_each_row_range_its_faster_gemm():
    timings = {16: (1.0, 2.0), 64: (2.0, 1.0), 256: (3.0, 1.0)}  # (ATen, oneDNN)
    assert [rules.library_for(timings, r) for r in (1, 32, 33, 128, 129, 5000)] == [
        "blas", "blas", "onednn", "onednn", "onednn", "onednn"]
    assert rules.library_for(None, 300) == "blas"


def test_the_few_row_kernels_are_timed_against_the_faster_gemm_library(fresh, monkeypatch):
    """A float32 shape: the two GEMM libraries first, then each bucket's kernel against the
    library its row range took; the entry keeps both timings and hands the extension both choices."""
    shape = tune.Shape("nk", "float32", 24, 40)
    if not tune.has_library_choice(shape):  # a torch without oneDNN's float32 matmul: ATen's alone
        assert "library" not in timing.measure(shape, buckets=(1,))
        return
    seen = []
    pools = []
    monkeypatch.setattr(timing, "weight_pool", lambda s, rows, seed: pools.append(rows) or ("pool", rows))
    monkeypatch.setattr(timing, "measure_library", lambda s, operands: operands == ("pool", 256) and
                        {16: (1.0, 2.0), 64: (2.0, 1.0), 256: (3.0, 1.0)})

    def fake_candidates(s, rows, libraries=("blas",), operands=None):
        assert operands == ("pool", 256)  # the one pool, rows enough for every bucket and the libraries
        seen.append((rows, libraries))
        return rows, libraries
    monkeypatch.setattr(timing, "candidates", fake_candidates)

    def fake_time_pair(call, **kw):  # the kernel wins to 48 rows; oneDNN 1.5, ATen 1.8 (1.2 at 64 rows)
        rows, libraries = call
        gemm = {"onednn": 1.5, "blas": 1.2 if rows == 64 else 1.8}
        return [1.0 if rows <= 48 else 2.0] + [gemm[lib] for lib in libraries]
    monkeypatch.setattr(timing, "time_pair", fake_time_pair)
    buckets = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64)  # finer than the default: a bucket at 48 and one at 64
    entry = timing.measure(shape, buckets)
    assert pools == [256]  # the weight's cold copies are made once for the whole measurement
    # oneDNN's range (past 32 rows) is timed against ATen's too: the faster is each bucket's GEMM
    assert seen == [(r, ("blas",) if r <= 32 else ("onednn", "blas")) for r in buckets]
    assert entry["library"] == {"16": [1e6, 2e6], "64": [2e6, 1e6], "256": [3e6, 1e6]}
    assert entry["gemm_at"]["48"] == "onednn" and entry["gemm_at"]["64"] == "blas"
    assert entry["timings"]["64"] == [2e6, 1.2e6]
    policy.apply(shape, entry)
    # each compared row count decides to the geometric middle of it and the next: 32 to 39, 48 to 55,
    # 64 (ATen's at its bucket) to 128, 256 (oneDNN) beyond
    assert native().gemm_library_choices() == [(0, "float32", 24, 40, [39, 55, 128, -1], [False, True, False, True])]
    kernel = [r for r, on in enumerate(native().few_rows_choices()[0][4], 1) if on]
    assert kernel == list(range(1, 49))
    assert rules.library_ranges({"timings": {}}) == ([-1], [False])  # no library measured: ATen's throughout


def test_measure_library_times_both_gemms_on_a_real_shape(fresh):
    shape = tune.Shape("kn", "float32", 40, 24)
    if not tune.has_library_choice(shape):
        pytest.skip("this torch has no oneDNN float32 inner product: ATen's GEMM is the only one")
    timings = timing.measure_library(shape, rows_list=(16, 64))
    assert sorted(timings) == [16, 64] and all(len(t) == 2 and min(t) > 0 for t in timings.values())


@pytest.mark.parametrize("library_exact", [False, True])
def test_w8a8_against_the_reducing_kernel_is_measured_at_every_bucket(monkeypatch, library_exact):
    """The reducing int8 kernel (the alternative where the library's int8 sums are not exact) can
    win at 1-2 rows and lose from 4: two early losses must not hand it every row count. Against
    the library's GEMM, two losses in a row still end the measuring."""
    class FakeExtension:
        def few_rows_max(self):
            return 64

        def linear_w8a8_library_exact(self):
            return library_exact

    monkeypatch.setattr(timing, "native", lambda: FakeExtension())
    # time_pair gets the row count
    monkeypatch.setattr(timing, "weight_pool", lambda shape, rows, seed: None)
    monkeypatch.setattr(timing, "candidates", lambda shape, rows, libraries=("blas",), operands=None: rows)
    monkeypatch.setattr(timing, "time_pair", lambda rows, **kw: (2.0, 1.0) if rows <= 2 else (1.0, 2.0))
    entry = timing.measure(tune.Shape("w8a8", "int8", 3072, 2048), buckets=(1, 2, 4, 8, 12))
    measured = [int(r) for r in entry["timings"]]
    if library_exact:
        assert measured == [1, 2]
    else:
        assert measured == [1, 2, 4, 8, 12]
        assert rules.kernel_rows(rules.entry_timings(entry), 12) == [False] * 3 + [True] * 9
    assert timing.stops_after_two_losses(tune.Shape("nk", "float32", 24, 40))


def test_candidates_are_timed_in_blocks_of_their_own_calls():
    """Each round runs one candidate per_block + 1 times in a row, then the other; the first call
    of a block (the one after the other candidate's) is not timed: a kernel timed right after a
    cold GEMM call ran 1.6-1.9x slower than after itself."""
    now, calls = [0.0], []

    def candidate(name, cost):
        def call():
            switched = not calls or calls[-1] != name
            calls.append(name)
            now[0] += 100.0 if switched else cost  # a switch costs 100 s on this clock
        return call

    fns = [candidate("k", 1.0), candidate("g", 2.0)]
    medians = timing.time_pair(fns, rounds=3, per_block=1, budget_s=1e9, clock=lambda: now[0])
    assert "".join(calls) == ("kk" + "gg") * 3
    assert medians == [1.0, 2.0]  # the switches' 100 s never counted
    calls.clear()
    timing.time_pair(fns, rounds=5, per_block=2, budget_s=0.0, clock=lambda: now[0])  # out of time
    assert "".join(calls) == ("kkk" + "ggg") * 2  # stops after the second round


def test_slow_candidates_are_timed_in_blocks_of_two():
    """Calls slow enough that two rounds of full blocks would overrun the budget: blocks of two
    from the call that showed it (a weight streamed from memory takes milliseconds, alike each call)."""
    now, calls = [0.0], []

    def candidate(name, cost):
        def call():
            calls.append(name)
            now[0] += cost
        return call

    fns = [candidate("k", 1.0), candidate("g", 3.0)]
    medians = timing.time_pair(fns, rounds=3, per_block=4, budget_s=50.0, clock=lambda: now[0])
    # k: 2 rounds x 4 blocks x 1 s = 40 s alone fits; g's first call (2 x 2 x 5 x 3 s = 60 s) does not
    assert "".join(calls) == "k" * 5 + "g" * 3 + ("k" * 3 + "g" * 3) * 2
    assert medians == [1.0, 3.0]
    calls.clear()
    timing.time_pair(fns, rounds=3, per_block=4, budget_s=1e9, clock=lambda: now[0])  # time enough: blocks of 4
    assert "".join(calls) == ("k" * 5 + "g" * 5) * 3


def test_one_pool_of_cold_copies_serves_every_row_count(fresh):
    """weight_pool's copies fill the shape's stream, each laid out as the calls read it (form kp:
    the matrix beside its packing), and candidates on its slices multiply its rows."""
    shape = tune.Shape("kp", "float32", 48, 40, stream_mb=1)
    x, pool, b = candidate_calls.weight_pool(shape, 8, 0)
    assert len(pool) == -(-(1 << 20) // shape.weight_bytes) and x.shape == (8, 48)
    for w, packed in pool:
        assert torch.equal(w, pool[0][0]) and torch.equal(packed, pool[0][1]) and w.is_contiguous()
    assert len({w.data_ptr() for w, _ in pool}) == len(pool)  # copies, not views of one
    kernel, gemm = candidate_calls.candidates(shape, 3, operands=(x, pool, b))
    want = torch.addmm(b, x[:3], pool[0][0])
    for call in (kernel, gemm):
        torch.testing.assert_close(call(), want, rtol=1e-5, atol=1e-5)


def test_ensure_measures_what_is_missing_once_then_reads_the_cache(fresh, monkeypatch):
    calls = []
    monkeypatch.setattr(policy, "measure", _fake_measure(calls))
    shapes = [tune.Shape("nk", "float32", 24, 40), tune.Shape("kn", "bfloat16", 30, 64)]
    entries = tune.ensure(shapes, measure_missing=True)
    assert calls == [s.name for s in shapes] and set(entries) == set(calls)
    choices = {(c[0], c[1], c[2], c[3]): c[4] for c in native().few_rows_choices()}
    assert [r for r, on in enumerate(choices[(0, "float32", 24, 40)], 1) if on] == list(range(1, 9))
    saved = json.loads(tune_cache.cache_path().read_text())
    assert saved["key"] == tune_cache.machine_key() and set(saved["entries"]) == set(calls)
    tune.forget()  # as a new process would start
    tune.ensure(shapes, measure_missing=True)
    assert len(calls) == 2  # nothing measured again: the cache held both


def test_shapes_alike_in_the_extensions_key_share_one_measurement(fresh, monkeypatch):
    """The extension keys a choice by form, dtype, K and N: an encoder's fc1 and a fold product of
    its size (other stream sizes) are measured once, and the first holds for both."""
    calls = []
    monkeypatch.setattr(policy, "measure", _fake_measure(calls))
    a, b = tune.Shape("nk", "float32", 24, 40, stream_mb=1), tune.Shape("nk", "float32", 24, 40, stream_mb=2)
    entries = tune.ensure([a, b], measure_missing=True)
    assert calls == [a.name] and entries[a.name] is entries[b.name]
    assert tune.ensure([b], measure_missing=True)[b.name] is entries[a.name] and calls == [a.name]


@pytest.mark.parametrize("content,why", [("{not json", "unreadable"), ('{"key": {}, "entries": {}}', "another machine")])
def test_a_corrupt_or_stale_cache_is_ignored_with_a_warning(fresh, monkeypatch, content, why):
    calls = []
    monkeypatch.setattr(policy, "measure", _fake_measure(calls))
    path = tune_cache.cache_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(content)
    with pytest.warns(UserWarning, match=why):
        tune.ensure([tune.Shape("nk", "float32", 8, 8)], measure_missing=True)
    assert calls == ["nk:float32:8x8"]
    assert json.loads(path.read_text())["key"] == tune_cache.machine_key()  # replaced by the new measurement


def test_a_malformed_entry_is_dropped_with_a_warning_and_measured_again(fresh, monkeypatch):
    calls = []
    monkeypatch.setattr(policy, "measure", _fake_measure(calls))
    good, bad = tune.Shape("nk", "float32", 8, 8), tune.Shape("nk", "float32", 8, 16)
    tune.ensure([good, bad], measure_missing=True)
    path = tune_cache.cache_path()
    data = json.loads(path.read_text())
    data["entries"][bad.name]["timings"] = {"1": [5]}  # one time where two belong
    path.write_text(json.dumps(data))
    tune.forget()
    with pytest.warns(UserWarning, match=rf"ignoring 1 malformed entries .*\({bad.name}, ...\)"):
        tune.ensure([good, bad], measure_missing=True)
    assert calls == [good.name, bad.name, bad.name]


def test_remeasure_measures_the_cached_shapes_again(fresh):
    """`--remeasure` drops the shapes from the file itself: save merges over what the file holds."""
    shape = tune.Shape("nk", "float32", 16, 24)
    tune.ensure([shape], measure_missing=True)
    path = tune_cache.cache_path()
    data = json.loads(path.read_text())
    data["entries"][shape.name]["timings"] = {r: [123456.0, 1.0] for r in data["entries"][shape.name]["timings"]}
    path.write_text(json.dumps(data))  # a planted result no real measurement gives
    assert tune_main(["--shapes", shape.name, "--remeasure"]) == 0
    timings = json.loads(path.read_text())["entries"][shape.name]["timings"]
    assert all(k < 123456.0 for k, _ in timings.values())


def test_two_processes_saving_at_once_keep_both_entries(fresh):
    code = ("import sys; from convs2s_kernels import tune_cache\n"
            "for i in range(30): tune_cache.save({f'{sys.argv[1]}{i}': {'timings': {'1': [1.0, 2.0]}}})\n")
    env = dict(__import__("os").environ, **{tune_cache.DIR_ENV: str(fresh)})
    procs = [subprocess.Popen([sys.executable, "-c", code, name], env=env) for name in ("a", "b")]
    assert [p.wait(timeout=120) for p in procs] == [0, 0]
    # read the one file they wrote (this process's key may differ: its thread count, set by other tests)
    files = list(fresh.rglob("*.json"))
    assert len(files) == 1
    assert set(json.loads(files[0].read_text())["entries"]) == {f"{n}{i}" for n in "ab" for i in range(30)}


def test_measuring_off_leaves_unmeasured_shapes_at_the_default(fresh, monkeypatch):
    monkeypatch.setenv(tune.ENV, "0")
    monkeypatch.setattr(policy, "measure", lambda shape: pytest.fail("measured with CONVS2S_TUNE=0"))
    assert tune.ensure([tune.Shape("nk", "float32", 8, 8)]) == {}
    assert native().few_rows_choices() == []


def test_bad_shapes_name_the_problem():
    with pytest.raises(ValueError, match="form must be one of nk, kn"):
        tune.Shape("mk", "float32", 1, 1)
    with pytest.raises(ValueError, match="int8 weights are stored"):
        tune.Shape("kn", "int8", 4, 4)
    with pytest.raises(ValueError, match="form:dtype:KxN"):
        tune.parse_shape("nk:12")
    assert tune.parse_shape("kn:1536x1024") == tune.Shape("kn", "float32", 1536, 1024)
    with pytest.raises(ValueError, match="power of two"):
        tune.Shape("nk", "float32", 4, 4, stream_mb=96)
    with pytest.raises(ValueError, match="@<MB>MB"):
        tune.parse_shape("nk:float32:4x4@96GB")
    with pytest.raises(ValueError, match="form w8a8 multiplies int8 weights"):
        tune.Shape("w8a8", "float32", 4, 4)
    streamed = tune.Shape("nk", "int8", 512, 40000, stream_mb=128)
    assert streamed.name == "nk:int8:512x40000@128MB" and tune.parse_shape(streamed.name) == streamed


def test_stream_mb_rounds_a_steps_bytes_up_to_a_power_of_two():
    assert [tune.stream_mb(b) for b in (1, 1 << 20, (1 << 20) + 1, 381_000_000, 512 << 20)] == [1, 1, 2, 512, 512]


def test_candidates_read_a_fresh_copy_of_the_weight_each_call(fresh, monkeypatch):
    """With stream_mb, each call multiplies the next of enough copies to fill it (cold, as in a
    step), and both candidates compute the same product."""
    seen = []
    shape = tune.Shape("kn", "float32", 64, 1024, stream_mb=1)  # 256 KB a weight: 4 copies
    real = native()

    class Spy:
        def __getattr__(self, name):
            return getattr(real, name)

        def small_gemm_kn(self, x, w, b):
            seen.append(w.data_ptr())
            return real.small_gemm_kn(x, w, b)
    monkeypatch.setattr(candidate_calls, "native", lambda: Spy())
    kernel, gemm = candidate_calls.candidates(shape, rows=3)
    outs = [kernel() for _ in range(8)]
    assert len(set(seen)) == 4 and seen[:4] == seen[4:], "four distinct copies, round and round"
    torch.testing.assert_close(outs[0], gemm(), rtol=1e-4, atol=1e-4)
    kernel()  # the GEMM took a copy of its own in between: not the one the kernel read last
    assert seen[-1] == seen[1], "both candidates draw from one cycle"
    for out in outs[1:]:
        assert torch.equal(out, outs[0])  # copies, not other weights


def test_the_w8a8_choice_picks_the_packed_kernel_or_its_alternative_per_row_count(fresh):
    """Form w8a8, with a packed weight: the measured rows take the packed int8 kernel, the others
    its alternative (the library's int8 GEMM where its sums are exact, else the reducing kernel);
    AMX keeps every call of 2 rows or more. Both candidates give the same products bit for bit
    (exact int32 sums, one rounding)."""
    C = native()
    K, N = 96, 80
    alternative = C.linear_w8a8_alternative()
    assert alternative == (2 if C.linear_w8a8_library_exact() else 0)
    unmeasured = [C.linear_w8a8_kernel(m, K, N, True) for m in range(1, 66)]
    if C.linear_w8a8_isa() == "avx512-vnni" and alternative == 0:
        assert unmeasured == [1] * 65, "VNNI: the packed kernel on a packed weight at every row count"
    measured = [m <= 5 or m == 20 for m in range(1, 65)]
    C.set_few_rows_choice(2, "int8", K, N, measured)
    chosen = [C.linear_w8a8_kernel(m, K, N, True) for m in range(1, 65)]
    if C.linear_w8a8_isa() == "amx-int8":
        assert chosen[1:] == [3] * 63
    elif tune.w8a8_has_choice():
        assert chosen == [1 if on else alternative for on in measured]
        # past the measured rows (an int8 encoder's B x S rows): the rules, not the alternative
        assert C.linear_w8a8_kernel(65, K, N, True) == unmeasured[64], "past the measured rows: the rules"
        if C.linear_w8a8_isa() == "avx2" and alternative == 0:
            assert unmeasured[64] == 1, "AVX2: the packed kernel from 12 rows where nothing was measured"
    else:  # the baseline: one kernel, nothing measured changes it
        assert chosen == unmeasured[:64]
    assert [C.linear_w8a8_kernel(m, K, N, False) for m in range(1, 65)] == [
        C.linear_w8a8_kernel(m, K, N + 1, False) for m in range(1, 65)], "no packed weight: the choice does not apply"
    with pytest.raises(RuntimeError, match="w8a8.*int8"):
        C.set_few_rows_choice(2, "float32", K, N, [True] * 64)
    kernel, other = candidate_calls.candidates(tune.Shape("w8a8", "int8", K, N), rows=7)
    assert torch.equal(kernel(), other())


def test_7_bit_activations_take_their_own_measured_choice(fresh):
    """Form w7a8 is set and consulted apart from w8a8: the AVX2 packed kernel runs 7-bit rows faster
    and the reducing kernel does not, so one weight can take different kernels at the two widths.
    Both candidates of a w7a8 shape give the same products bit for bit."""
    C = native()
    K, N = 96, 80
    if not tune.w8a8_has_choice():
        pytest.skip(f"no int8 kernel choice on this CPU ({C.linear_w8a8_isa()}: one kernel, or AMX at every row count)")
    alternative = C.linear_w8a8_alternative()
    C.set_few_rows_choice(tune.FORMS["w8a8"], "int8", K, N, [m <= 4 for m in range(1, 65)])
    C.set_few_rows_choice(tune.FORMS["w7a8"], "int8", K, N, [m >= 3 for m in range(1, 65)])
    eight = [C.linear_w8a8_kernel(m, K, N, True) for m in range(1, 65)]
    seven = [C.linear_w8a8_kernel(m, K, N, True, 7) for m in range(1, 65)]
    assert eight == [1 if m <= 4 else alternative for m in range(1, 65)]
    assert seven == [1 if m >= 3 else alternative for m in range(1, 65)]
    with pytest.raises(RuntimeError, match="w7a8.*int8"):
        C.set_few_rows_choice(tune.FORMS["w7a8"], "float32", K, N, [True] * 64)
    with pytest.raises(RuntimeError, match="activation_bits must be 8 or 7, got 6"):
        C.linear_w8a8_kernel(4, K, N, True, 6)
    with pytest.raises(ValueError, match="form w7a8 multiplies int8 weights"):
        tune.Shape("w7a8", "float32", K, N)
    kernel, other = candidate_calls.candidates(tune.Shape("w7a8", "int8", K, N), rows=7)
    assert torch.equal(kernel(), other())


def test_cli_prints_the_table_and_refuses_bad_shapes(fresh):
    env = dict(__import__("os").environ, **{tune_cache.DIR_ENV: str(fresh)})
    run = lambda *a: subprocess.run([sys.executable, "-m", "convs2s_kernels.tune", *a], capture_output=True,  # noqa: E731
                                    text=True, env=env, timeout=300)
    ok = run("--shapes", "nk:16x24,nk:16x40@8MB,kn:bfloat16:16x32", "--dtype", "int8")
    assert ok.returncode == 0, ok.stderr
    # the int8 twin of a shape timed cold streams what an int8 decoder of that float size asks for:
    # a quarter of the bytes
    for name in ("nk:float32:16x24", "nk:float32:16x40@8MB", "kn:bfloat16:16x32", "nk:int8:16x24", "nk:int8:16x40@2MB"):
        assert f"| {name} |" in ok.stdout
    assert "kn:int8" not in ok.stdout and "RuntimeWarning" not in ok.stderr
    assert "--dtype int8: not for kn:bfloat16:16x32" in ok.stderr
    bad = run("--shapes", "nk:16")
    assert bad.returncode == 2 and "form:dtype:KxN" in bad.stderr.splitlines()[-1]


def test_the_decoder_asks_for_its_step_weight_shapes(fresh, monkeypatch):
    model = build_model("fconv_iwslt_de_en", 50, 60).eval()
    shapes = step_weight_shapes(prepare(model))
    names = [s.name for s in shapes]
    # every shape is timed after the step's whole weight set: fc1, projections, convolutions, fc2, fc3
    step_bytes = 4 * (256 * 256 + 256 * 256 + 256 * 60 + sum(conv.kernel_width * conv.in_channels * conv.out_channels
                                                              for conv in model.decoder.convolutions))
    stream = f"@{tune.stream_mb(step_bytes)}MB"
    # the step reads every float weight packed (form kp): fc1 ... fc3, and a 256-channel convolution of
    # width 3, (3 * 256, 2 * 256)
    assert names[0] == "kp:float32:256x256" + stream and names[-1] == "kp:float32:256x60" + stream
    assert "kp:float32:768x512" + stream in names and all(n.startswith("kp:") for n in names)
    quantize_decoder_int8(model)
    w8a8 = [s.name for s in step_weight_shapes(prepare(model))]
    if tune.w8a8_has_choice():  # the packed int8 kernel against the library or the reducing kernel
        assert "w8a8:int8:768x512@2MB" in w8a8 and all(n.startswith("w8a8:int8:") for n in w8a8)
    else:  # AMX or the baseline: nothing to choose
        assert w8a8 == []
    quantize_decoder_int8(model, activations="int7")  # 7-bit activations: their own choice (form w7a8)
    w7a8 = [s.name for s in step_weight_shapes(prepare(model))]
    assert w7a8 == [n.replace("w8a8:", "w7a8:") for n in w8a8]
    quantize_decoder_int8(model, activations="float")
    int8 = [s.name for s in step_weight_shapes(prepare(model))]
    assert "nk:int8:768x512@2MB" in int8 and all(":int8:" in n for n in int8)  # a quarter of the bytes
    # what `tune --dtype int8` times for the float shapes is what this int8 decoder asks for
    assert all(n.endswith(f"@{tune.twin_stream_mb(shapes[0], 'int8')}MB") for n in int8)
    asked = []
    monkeypatch.setattr("convs2s.engine.step.ensure_kernel_choice", lambda s: asked.append([x.name for x in s]))
    with torch.no_grad():
        prepare(model).init_decoder_state(prepare(model).encode(torch.tensor([[5, 6, 2]])), beam=2)
    assert asked == [int8]
    # folding attention: each layer's fold products too (E = 256, C = 256 in every layer of this
    # architecture: keys x W_in and values x W_out^T, both (E, C)), in float under float activations,
    # packed, and in int8 where the step multiplies int8 by int8 (DerivedWeights.fold_int8), a quarter of the bytes
    folds = [s.name for s in fold_weight_shapes(prepare(model))]
    fold_bytes = 4 * 2 * 256 * 256 * sum(a is not None for a in model.decoder.attention)
    assert folds == [f"kp:float32:256x256@{tune.stream_mb(fold_bytes)}MB"]
    with torch.no_grad():
        prepare(model).init_decoder_state(prepare(model).encode(torch.tensor([[5, 6, 2]])), beam=2, fold_attention=True)
    assert asked[-1] == int8 + folds
    for activations, form in (("int8", "w8a8"), ("int7", "w7a8")):
        quantize_decoder_int8(model, activations=activations)
        int8_folds = [s.name for s in fold_weight_shapes(prepare(model))]
        want = [f"{form}:int8:256x256@{tune.stream_mb(fold_bytes // 4)}MB"] if tune.w8a8_has_choice() else []
        assert int8_folds == want
        with torch.no_grad():
            prepare(model).init_decoder_state(prepare(model).encode(torch.tensor([[5, 6, 2]])), beam=2, fold_attention=True)
        assert asked[-1] == [s.name for s in step_weight_shapes(prepare(model))] + want


def test_the_encoder_asks_for_its_weight_shapes_only_when_translating(fresh, monkeypatch):
    model = build_model("fconv_iwslt_de_en", 50, 60).eval()
    names = [s.name for s in encoder_weight_shapes(prepare(model))]
    enc = model.encoder
    enc_bytes = 4 * (256 * 256 + 256 * 256 + sum(conv.kernel_width * conv.in_channels * conv.out_channels
                                                  for conv in enc.convolutions))  # fc1, convolutions, fc2
    stream = f"@{tune.stream_mb(enc_bytes)}MB"
    # fc1 = fc2's shape; the convs; all read packed (form kp) as the decoding step reads its weights
    assert names == ["kp:float32:256x256" + stream, "kp:float32:768x512" + stream]
    asked = []
    monkeypatch.setattr("convs2s.engine.prepared.ensure_kernel_choice", lambda s: asked.append([x.name for x in s]))
    src = torch.tensor([[5, 6, 2]])
    with torch.no_grad():
        want = prepare(model).encode(src)
    assert asked == [names]
    prepare(model).encode(src)  # with gradients (training, scoring): plain PyTorch, nothing to choose
    model.encode(src)  # the model's own encoder never asks
    with torch.no_grad():
        model.encode(src)
    assert asked == [names]
    model.use_backend("reference")
    with torch.no_grad():
        ref = prepare(model).encode(src)
    torch.testing.assert_close(want.z, ref.z, atol=1e-5, rtol=1e-4)  # the cpp products against the reference


def test_an_unwritable_cache_warns_and_keeps_the_choice_for_this_process(fresh, monkeypatch):
    monkeypatch.setattr(policy, "measure", _fake_measure([]))
    blocker = fresh / "not-a-folder"
    blocker.write_text("")
    monkeypatch.setenv(tune_cache.DIR_ENV, str(blocker / "cache"))  # mkdir under a file fails
    with pytest.warns(UserWarning, match="could not save the kernel choice"):
        entries = tune.ensure([tune.Shape("nk", "float32", 8, 8)], measure_missing=True)
    assert list(entries) == ["nk:float32:8x8"]
    assert native().few_rows_choices()[0][:4] == (0, "float32", 8, 8)


def test_the_environment_report_says_what_is_measured(fresh, monkeypatch):
    from convs2s_kernels.report import kernel_choice_line

    assert kernel_choice_line().startswith("kernel choice: nothing measured here yet")
    monkeypatch.setattr(policy, "measure", _fake_measure([]))
    tune.ensure([tune.Shape("nk", "float32", 8, 8)], measure_missing=True)
    assert kernel_choice_line().startswith("kernel choice: 1 weight shapes measured on this machine")


def test_a_new_thread_count_drops_the_choices_in_force(fresh, monkeypatch):
    calls = []
    monkeypatch.setattr(policy, "measure", _fake_measure(calls))
    shape = tune.Shape("nk", "float32", 8, 8)
    threads = torch.get_num_threads()
    try:
        tune.ensure([shape], measure_missing=True)
        torch.set_num_threads(1 if threads != 1 else 2)
        tune.ensure([shape], measure_missing=True)  # another machine key: measured for it
        assert len(calls) == 2
        torch.set_num_threads(threads)
        tune.ensure([shape], measure_missing=True)  # back: read from that key's cache
        assert len(calls) == 2 and native().few_rows_choices()[0][:4] == (0, "float32", 8, 8)
    finally:
        torch.set_num_threads(threads)


def test_saving_merges_what_another_process_wrote(fresh):
    tune_cache.save({"a": {"timings": {}}})
    tune_cache.save({"b": {"timings": {}}})  # a second writer that never read "a"
    assert set(tune_cache.load()) == {"a", "b"}


@torch.no_grad()
def test_the_attention_fold_runs_the_library_chosen_for_its_shapes(fresh):
    """Folding attention multiplies through the dispatched linear at the keys fold_weight_shapes
    names: with oneDNN chosen there (and no few-row kernel), the profiler sees oneDNN's op twice per
    layer, and the folded products equal the plain ones to float32 rounding."""
    from convs2s.engine.state import FoldedAttention

    C = native()
    onednn = C.onednn_gemm_available()  # its first call tries the op once: not inside the profile
    model = build_model("fconv_iwslt_de_en", 50, 60).eval()
    enc = model.encode(torch.tensor([[5, 6, 7, 8, 2], [1, 9, 10, 11, 2]]))
    layers = [a for a in model.decoder.attention if a is not None]
    d = prepare(model).derived
    for shape in fold_weight_shapes(prepare(model)):
        C.set_few_rows_choice(tune.FORMS[shape.form], shape.dtype, shape.K, shape.N, [False] * C.few_rows_max())
        C.set_gemm_library_choice(tune.FORMS[shape.form], shape.dtype, shape.K, shape.N, [-1], [True])
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        folded = [FoldedAttention(d(a.in_projection), d(a.out_projection), enc) for a in layers]
    calls = sum(e.name == "mkldnn::_linear_pointwise" for e in prof.events())
    assert calls == (2 * len(layers) if onednn else 0)
    for a, f in zip(layers, folded):
        w_in, w_out = a.in_projection.effective_weight(), a.out_projection.effective_weight()
        torch.testing.assert_close(f.z_in, torch.matmul(enc.z, w_in), atol=2e-5, rtol=1e-4)
        torch.testing.assert_close(f.y_out, torch.matmul(enc.y, w_out.t()), atol=2e-5, rtol=1e-4)


@torch.no_grad()
@pytest.mark.parametrize("int8", [False, True], ids=["float", "int8-weights-float-activations"])
def test_the_attention_fold_reads_both_weights_packed_on_the_kernel_chosen_for_them(fresh, int8):
    """With the few-row kernel chosen for the fold's shape, each layer's two products read the
    packed (E, C) matrices (DerivedWeights.fold_packed), in 64-row pieces past the kernels' cap: 3 x 30 = 90
    rows make two kernel calls per product. A step with int8 weights and float activations changes
    nothing here (the fold multiplies float weights). The folded products equal the plain ones to
    float32 rounding."""
    from convs2s.engine.state import FoldedAttention

    C = native()
    model = build_model("fconv_iwslt_de_en", 50, 60).eval()
    if int8:
        quantize_decoder_int8(model, True, activations="float")
    g = torch.Generator().manual_seed(7)
    enc = model.encode(torch.cat([torch.randint(4, 50, (3, 29), generator=g), torch.full((3, 1), 2)], 1))
    layers = [a for a in model.decoder.attention if a is not None]
    d = prepare(model).derived
    (shape,) = fold_weight_shapes(prepare(model))
    C.set_few_rows_choice(tune.FORMS[shape.form], shape.dtype, shape.K, shape.N, [True] * C.few_rows_max())
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        folded = [FoldedAttention(d(a.in_projection), d(a.out_projection), enc) for a in layers]
    calls = sum(e.name == "convs2s::few_rows_kn_packed" for e in prof.events())
    assert calls == 2 * 2 * len(layers)
    assert not any(e.name in ("mkldnn::_linear_pointwise", "aten::mm", "aten::addmm") for e in prof.events())
    for a, f in zip(layers, folded):
        w_in, w_out = a.in_projection.effective_weight(), a.out_projection.effective_weight()
        torch.testing.assert_close(f.z_in, torch.matmul(enc.z, w_in), atol=2e-5, rtol=1e-4)
        torch.testing.assert_close(f.y_out, torch.matmul(enc.y, w_out.t()), atol=2e-5, rtol=1e-4)
    # the packings are made once and kept while the weights stay
    assert d(layers[0].in_projection).fold_packed(transposed=True) is d(layers[0].in_projection).fold_packed(transposed=True)


@torch.no_grad()
def test_the_packed_kernel_takes_rows_past_its_cap_in_pieces_only_where_it_won_at_the_cap(fresh):
    """Past the kernels' 64 rows, a packed product runs the kernel in 64-row pieces (up to 8 of them)
    where the kernel choice gave it 64 rows, and the GEMM where it did not or beyond 8 pieces;
    ragged sizes, equal to float32 rounding."""
    C = native()
    K, N = 70, 130
    g = torch.Generator().manual_seed(3)
    w, b = torch.randn(N, K, generator=g) / K ** 0.5, torch.randn(N, generator=g)
    packed = ck.pack_linear_weight(w)
    cap = C.few_rows_max()
    for at_cap, rows in ((True, 65), (True, 2 * cap + 3), (False, 2 * cap + 3), (True, 8 * cap), (True, 8 * cap + 1)):
        C.set_few_rows_choice(tune.FORMS["kp"], "float32", K, N, [True] * (cap - 1) + [at_cap])
        x = torch.randn(rows, K, generator=g)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            got = ck.linear(x, w, b, packed=packed, backend="cpp")
        calls = sum(e.name == "convs2s::few_rows_kn_packed" for e in prof.events())
        assert calls == (-(-rows // cap) if at_cap and rows <= 8 * cap else 0), (at_cap, rows)
        torch.testing.assert_close(got, torch.nn.functional.linear(x, w, b), atol=2e-5, rtol=1e-4)


def test_the_encoder_reads_its_float_weights_packed_on_the_kernel_chosen_for_them(fresh):
    """Translating with the few-row kernel chosen for the encoder's shapes: fc1, every convolution
    (conv_glu with packed=) and fc2 read the packed weights, 3 x 30 = 90 rows in two 64-row pieces
    each; the result equals the reference backend's. With gradients nothing reads them."""
    C = native()
    model = build_model("fconv_iwslt_de_en", 50, 60).eval()
    for shape in encoder_weight_shapes(prepare(model)):
        C.set_few_rows_choice(tune.FORMS[shape.form], shape.dtype, shape.K, shape.N, [True] * C.few_rows_max())
    g = torch.Generator().manual_seed(5)
    src = torch.cat([torch.randint(4, 50, (3, 29), generator=g), torch.full((3, 1), 2)], 1)
    src[0, :4] = 1  # left padding: the pad mask reaches the packed convolutions
    with torch.no_grad(), torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        got = prepare(model).encode(src)
    calls = sum(e.name == "convs2s::few_rows_kn_packed" for e in prof.events())
    assert calls == 2 * (2 + len(model.encoder.convolutions))
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        prepare(model).encode(src)
    assert not any(e.name == "convs2s::few_rows_kn_packed" for e in prof.events())
    model.use_backend("reference")
    with torch.no_grad():
        ref = prepare(model).encode(src)
    torch.testing.assert_close(got.z, ref.z, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(got.y, ref.y, atol=1e-5, rtol=1e-4)


def test_fold_packings_follow_the_weight_and_are_dropped_for_training(fresh):
    """DerivedWeights.fold_packed: a new packing after the weight changes in place, none with
    gradients or in training, where the copies made before are let go."""
    model = build_model("fconv_iwslt_de_en", 50, 60).eval()
    proj = prepare(model).derived(next(a for a in model.decoder.attention if a is not None).in_projection)
    with torch.no_grad():
        first = proj.fold_packed(transposed=True)
        assert torch.equal(first, ck.pack_linear_weight(proj.weight().t()))
        proj.module.weight_v.add_(1.0)
        second = proj.fold_packed(transposed=True)
        assert second is not first and torch.equal(second, ck.pack_linear_weight(proj.weight().t()))
        assert proj.fold_packed() is proj.step_packed() is not None  # W_out's layout: the step's own packing
    model.train()
    with torch.no_grad():
        assert proj.fold_packed() is None  # training
    assert not proj._packs and proj.packed_now is None  # the copies let go
    model.eval()
    assert proj.fold_packed(transposed=True) is None  # gradients on
