"""The measured compute type (issue 48): ``auto`` is the faster of fp32 and bf16 as timed on the
model here, never what a CPU flag says; ``int8`` the fastest int8 variant; cached per machine."""

import json
import time

import pytest
import torch

from convs2s import compute_type as ct
from convs2s.errors import Convs2sError

from conftest import tiny_fconv


@pytest.fixture
def model():
    return tiny_fconv(32, 2, 40)


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("CONVS2S_TUNE_CACHE", str(tmp_path))
    for var in (ct.DECODE_ENV, ct.TRAIN_ENV):
        monkeypatch.delenv(var, raising=False)


class FakeTimes:
    """A ``measure`` that returns fixed times per variant and counts its calls."""

    def __init__(self, **seconds):
        self.seconds, self.calls = seconds, []

    def __call__(self, model, names, **kw):
        self.calls.append(list(names))
        return {n: list(self.seconds[n]) for n in names}


def test_pick_takes_the_smallest_geometric_mean_of_ratios_and_ties_go_first():
    assert ct.pick({"fp32": [1.0, 10.0], "bf16": [2.0, 10.0]}, ["fp32", "bf16"])[0] == "fp32"
    assert ct.pick({"fp32": [1.0, 10.0], "bf16": [0.9, 9.0]}, ["fp32", "bf16"])[0] == "bf16"
    # each shape counts alike: a 2x loss on the small one outweighs a 1.5x gain on the large one
    assert ct.pick({"fp32": [1.0, 100.0], "bf16": [2.0, 66.7]}, ["fp32", "bf16"])[0] == "fp32"
    assert ct.pick({"fp32": [1.0], "bf16": [1.0]}, ["fp32", "bf16"])[0] == "fp32"
    # fp32 is left only for a lead beyond noise (3%)
    assert ct.pick({"fp32": [1.0, 10.0], "bf16": [0.99, 9.8]}, ["fp32", "bf16"])[0] == "fp32"
    assert ct.pick({"fp32": [1.0, 10.0], "bf16": [0.95, 9.5]}, ["fp32", "bf16"])[0] == "bf16"
    assert "fp32 1000.0 ms, bf16 2000.0 ms" in ct.pick({"fp32": [1.0], "bf16": [2.0]}, ["fp32", "bf16"])[1]


def test_auto_takes_fp32_where_bf16_was_slower_though_the_flags_say_native(model, monkeypatch):
    import convs2s_kernels.env as env

    monkeypatch.setattr(env, "cpu_flags", lambda: ["avx2", "fma", "avx512f", "avx512_bf16"])  # the flag rule said bf16
    slow_bf16 = FakeTimes(fp32=[1.0, 10.0], bf16=[1.9, 21.0])
    choice = ct.choose_decoding(model, "auto", measure=slow_bf16)
    assert choice.name == "fp32" and not choice.cached and slow_bf16.calls == [["fp32", "bf16"]]
    assert "measured fp32" in choice.why and "bf16" in choice.why


def test_auto_takes_bf16_where_it_was_faster_though_no_flag_says_native(model, monkeypatch):
    import convs2s_kernels.env as env

    monkeypatch.setattr(env, "cpu_flags", lambda: ["avx2", "fma"])
    fast_bf16 = FakeTimes(fp32=[1.0, 10.0], bf16=[0.6, 5.5])
    assert ct.choose_decoding(model, "auto", measure=fast_bf16).name == "bf16"


def test_the_choice_is_cached_per_model_shape_and_remeasured_on_request(model):
    fake = FakeTimes(fp32=[1.0, 10.0], bf16=[0.5, 5.0])
    assert ct.choose_decoding(model, "auto", measure=fake).name == "bf16"
    again = ct.choose_decoding(model, "auto", measure=fake)
    assert again.name == "bf16" and again.cached and len(fake.calls) == 1  # read, not measured
    fake.seconds["bf16"] = [2.0, 20.0]
    assert ct.choose_decoding(model, "auto", measure=fake, remeasure=True).name == "fp32" and len(fake.calls) == 2
    assert ct.choose_decoding(model, "auto", measure=fake).name == "fp32"  # the new answer was saved
    other = tiny_fconv(32, 3, 40)
    ct.choose_decoding(other, "auto", measure=fake)
    assert len(fake.calls) == 3  # another shape is measured on its own
    # another beam or decoder is its own entry too
    ct.choose_decoding(model, "auto", beam=1, measure=fake)
    assert len(fake.calls) == 4
    files = list(ct._cache_path()[0].parent.glob("compute-type-*.json"))
    assert len(files) == 1 and len(json.loads(files[0].read_text())["entries"]) == 3


def test_each_backend_has_its_own_answer(model):
    fake = FakeTimes(fp32=[1.0, 10.0], bf16=[0.5, 5.0])
    ct.choose_decoding(model.use_backend("reference"), "auto", measure=fake)
    assert not ct.choose_decoding(model.use_backend("cpp"), "auto", measure=fake).cached and len(fake.calls) == 2
    assert ct.choose_decoding(model.use_backend("reference"), "auto", measure=fake).cached


def test_an_unwritable_cache_warns_and_keeps_the_answer(model, monkeypatch, tmp_path):
    blocked = tmp_path / "file"
    blocked.write_text("not a folder")
    monkeypatch.setenv("CONVS2S_TUNE_CACHE", str(blocked / "cache"))
    with pytest.warns(UserWarning, match="could not save the compute-type choice"):
        choice = ct.choose_decoding(model, "auto", measure=FakeTimes(fp32=[1.0, 10.0], bf16=[0.5, 5.0]))
    assert choice.name == "bf16"


def test_a_new_machine_key_measures_again(model, monkeypatch):
    from convs2s_kernels import tune_cache

    fake = FakeTimes(fp32=[1.0, 10.0], bf16=[0.5, 5.0])
    ct.choose_decoding(model, "auto", measure=fake)
    key = tune_cache.machine_key()
    monkeypatch.setattr(tune_cache, "machine_key", lambda: dict(key, torch="9.9.9"))  # a new torch
    assert not ct.choose_decoding(model, "auto", measure=fake).cached and len(fake.calls) == 2


def test_auto_never_takes_int8_and_int8_takes_the_fastest_int8_variant(model):
    fake = FakeTimes(fp32=[1.0, 10.0], bf16=[1.1, 11.0], **{n: [0.1, 1.0] for n in ct.INT8_VARIANTS})
    assert ct.choose_decoding(model, "auto", measure=fake).name == "fp32"
    fake.seconds["int7e"] = [0.05, 0.6]
    choice = ct.choose_decoding(model, "int8", measure=fake)
    assert choice.name == "int7e" and fake.calls[-1] == list(ct.INT8_VARIANTS)
    for name in ("fp32", "bf16", "w7a7"):  # named outright: no choice, nothing measured
        assert ct.choose_decoding(model, name, measure=fake).name == name
    assert len(fake.calls) == 2


def test_environment_overrides_auto_and_bad_names_are_one_line_errors(model, monkeypatch):
    fake = FakeTimes(fp32=[1.0, 10.0], bf16=[0.5, 5.0])
    monkeypatch.setenv(ct.DECODE_ENV, "fp32")
    choice = ct.choose_decoding(model, "auto", measure=fake)
    assert choice.name == "fp32" and f"{ct.DECODE_ENV}=fp32" in choice.why and not fake.calls
    assert ct.choose_decoding(model, "bf16", measure=fake).name == "bf16"  # an explicit type wins over it
    monkeypatch.setenv(ct.DECODE_ENV, "int8")  # as --compute-type int8: the fastest int8 variant
    fake.seconds.update({n: [0.2, 2.0] for n in ct.INT8_VARIANTS}, int7=[0.1, 1.0])
    choice = ct.choose_decoding(model, "auto", measure=fake)
    assert choice.name == "int7" and choice.why.startswith(f"{ct.DECODE_ENV}=int8, measured")
    monkeypatch.setenv(ct.DECODE_ENV, "fp12")
    with pytest.raises(Convs2sError, match="unknown compute type 'fp12'"):
        ct.choose_decoding(model, "auto", measure=fake)
    with pytest.raises(Convs2sError, match="unknown compute type 'int4'"):
        ct.candidates_for("int4")


def test_measuring_off_and_nothing_cached_is_fp32(model, monkeypatch):
    monkeypatch.setenv("CONVS2S_TUNE", "0")
    choice = ct.choose_decoding(model, "auto")
    assert choice.name == "fp32" and "measuring is off" in choice.why


def test_apply_variant_sets_the_dtype_and_the_quantisation(model):
    ct.apply_variant(model, "bf16")
    assert next(model.parameters()).dtype == torch.bfloat16
    ct.apply_variant(model, "fp32")
    assert next(model.parameters()).dtype == torch.float32
    from convs2s.engine import prepare

    layers = lambda part: [d for d in map(prepare(model).derived, part.modules()) if d is not None]  # noqa: E731
    ct.apply_variant(model, "w7a7e")
    dec, enc = layers(model.decoder), layers(model.encoder)
    assert dec and all(m.use_int8 and m.int8_activation_bits == 7 and m.int8_weight_bits == 7 for m in dec)
    assert enc and all(m.use_int8 and m.int8_activation_bits == 7 and m.int8_weight_bits == 8 for m in enc)
    ct.apply_variant(model, "int8")
    assert all(m.use_int8 for m in layers(model.decoder)) and not any(m.use_int8 for m in layers(model.encoder))
    ct.apply_variant(model, "fp32")
    assert not any(m.use_int8 for m in layers(model))


@pytest.mark.parametrize("backend", ["reference", "cpp"])
def test_measured_end_to_end_on_this_machine(model, monkeypatch, backend):
    """Real timings on this machine: both candidates timed on the model, the choice is one of them
    and matches the times, the caller's model is untouched, and the answer is cached."""
    import convs2s_kernels as ck

    if backend == "cpp" and ck.available_backends().get("cpp") is not None:
        pytest.skip(f"cpp backend not built: {ck.available_backends()['cpp']}")
    monkeypatch.setenv("CONVS2S_TUNE", "1")
    model.use_backend(backend)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    from convs2s.engine import prepare

    flags = lambda: [(d.use_int8, d.int8_activation_bits)  # noqa: E731
                     for d in map(prepare(model).derived, model.modules()) if d is not None]
    flags_before = flags()
    choice = ct.choose_decoding(model, "auto", beam=2)
    s = choice.seconds
    assert set(s) == {"fp32", "bf16"} and all(min(t) > 0 for t in s.values())
    # both shapes timed, unless a candidate was FAR behind on the few-row one (then it keeps that time)
    assert all(len(t) == 2 or (len(t) == 1 and t[0] > ct.FAR * min(u[0] for u in s.values())) for t in s.values())
    assert choice.name == ct.pick(choice.seconds, ["fp32", "bf16"])[0]
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())
    assert next(model.parameters()).dtype == torch.float32 and model.backend == f"{backend},reference" \
        if backend != "reference" else model.backend == "reference"
    assert flags() == flags_before
    int8 = ct.choose_decoding(model, "int8", beam=2)  # seven int8 variants timed on copies sharing the weights
    assert int8.name in ct.INT8_VARIANTS and set(int8.seconds) == set(ct.INT8_VARIANTS)
    assert flags() == flags_before and all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())
    assert ct.choose_decoding(model, "auto", beam=2).cached


def test_training_choice_measured_end_to_end_and_cached(monkeypatch):
    monkeypatch.setenv("CONVS2S_TUNE", "1")
    choice = ct.choose_training("auto", torch.device("cpu"), channels=16, kernel=3, tokens=100, backend="reference")
    assert choice.name in ("fp32", "bf16") and set(choice.seconds) == {"fp32", "bf16"}
    assert choice.name == ct.pick(choice.seconds, ["fp32", "bf16"])[0]
    assert ct.choose_training("auto", torch.device("cpu"), channels=16, kernel=3, tokens=100,
                              backend="reference").cached
    monkeypatch.setenv(ct.TRAIN_ENV, "bf16")
    assert ct.choose_training("auto", torch.device("cpu"), channels=16, kernel=3, tokens=100).name == "bf16"
    monkeypatch.setenv(ct.TRAIN_ENV, "fp16")
    with pytest.raises(Convs2sError, match="CONVS2S_PRECISION must be fp32, bf16 or auto"):
        ct.choose_training("auto", torch.device("cpu"), channels=16, kernel=3, tokens=100)


def test_time_interleaved_alternates_the_order_and_takes_medians():
    order, now = [], [0.0]
    cost = {"a": iter([0, 5.0, 1.0, 2.0]), "b": iter([0, 9.0, 3.0, 4.0])}  # the warm-up's, then each round's

    def run(name):
        order.append(name)
        now[0] += next(cost[name])

    out = ct.time_interleaved({"a": lambda: run("a"), "b": lambda: run("b")}, rounds=3, clock=lambda: now[0])
    assert order == ["a", "b", "a", "b", "b", "a", "a", "b"]  # warm-up, then rounds in alternating order
    assert out == {"a": 2.0, "b": 4.0}  # medians of (5, 1, 2) and (9, 3, 4)


def test_a_candidate_far_slower_in_the_first_round_is_timed_once():
    order, now = [], [0.0]
    cost = {"fast": iter([0, 1.0, 1.0, 1.0]), "slow": iter([0, 2.5, 2.5, 2.5])}

    def run(name):
        order.append(name)
        now[0] += next(cost[name])

    out = ct.time_interleaved({"fast": lambda: run("fast"), "slow": lambda: run("slow")}, rounds=3,
                              clock=lambda: now[0])
    assert order == ["fast", "slow", "fast", "slow", "fast", "fast"] and out == {"fast": 1.0, "slow": 2.5}


def test_the_screen_stops_a_candidate_far_behind_and_runs_no_larger_shape_for_it():
    """Issue 58: bf16 emulated in software, 20-57x behind fp32 on the few-row decoding, costs FAR
    times fp32's time there (its runs stop at the deadline) and is not run on the many-row one
    (it took 5 minutes there on a Zen 3)."""
    calls, now = [], [0.0]
    cost = {("fp32", 0): 1.0, ("bf16", 0): 57.0, ("int8", 0): 3.9, ("fp32", 1): 10.0, ("int8", 1): 50.0}
    spent = {}

    def run(name, shape, deadline):
        calls.append((name, shape))
        start = now[0]
        now[0] = start + cost[name, shape]
        if deadline is not None and now[0] > deadline:  # stopped at the next step past it
            now[0] = deadline + 0.01
        spent[name] = spent.get(name, 0.0) + now[0] - start

    out = ct.screen(run, ["fp32", "bf16", "int8"], 2, clock=lambda: now[0])
    assert out == {"fp32": pytest.approx([1.0, 10.0]), "bf16": pytest.approx([ct.FAR + 0.01]),
                   "int8": pytest.approx([3.9, 10.0 * ct.FAR + 0.01])}  # int8 within FAR on the first: stopped on the second
    assert ("bf16", 1) not in calls and calls.count(("bf16", 0)) == 2  # warm-up and timed, then dropped
    assert spent["bf16"] <= 2 * (ct.FAR * 1.0 + 0.01)  # 8 s of clock, not 114
    assert ct.pick(out, ["fp32", "bf16", "int8"])[0] == "fp32"
    calls.clear()
    out = ct.screen(run, ["fp32", "bf16"], 2, clock=lambda: now[0])
    assert out == {"fp32": pytest.approx([1.0]), "bf16": pytest.approx([ct.FAR + 0.01])}
    assert all(shape == 0 for _, shape in calls)  # a lone survivor: nothing left to choose, nothing more run


def test_a_lone_survivor_of_the_screen_is_not_timed_again(model, monkeypatch):
    """With bf16 screened out on the few-row decoding, fp32 keeps its screen time: no many-row
    decoding, no interleaved rounds, no kernel-choice measurement inside the compute type's (the
    decoding measures its own when it runs); bf16's warm-up, under a deadline, decodes one word
    one step (an encoding cannot be stopped), its timed run the whole workload until the deadline."""
    runs = []
    real = ct.generate

    def counting(*a, **kw):
        runs.append((next(a[0].parameters()).dtype, [len(s) for s in a[1]]))
        if runs[-1][0] == torch.bfloat16:
            time.sleep(0.2)  # far behind fp32's few milliseconds on this tiny model
        return real(*a, **kw)

    monkeypatch.setattr(ct, "generate", counting)
    seconds = ct.measure_decoding(model, ["fp32", "bf16"], beam=2)
    assert len(seconds["fp32"]) == 1 and len(seconds["bf16"]) == 1 and seconds["bf16"][0] >= 0.2
    full = [len(s) for s in ct._decode_workload(model, 2)[0][0]]
    assert runs == [(torch.float32, full), (torch.float32, full), (torch.bfloat16, [1]), (torch.bfloat16, full)]
    choice = ct.choose_decoding(model, "auto", beam=2, measure=lambda *a, **k: seconds)
    assert choice.name == "fp32" and "for a 2-row decoding; measured in" in choice.why
