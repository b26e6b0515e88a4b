"""Backend selection, the environment override, and the errors of the public ops."""

import pytest
import torch

import convs2s_kernels as ck
from convs2s_kernels import dispatch
from harness import require_or_skip


def step_args(requires_grad=False):
    x_t = torch.randn(2, 4, requires_grad=requires_grad)
    state = torch.randn(2, 2, 4)
    w = torch.randn(3, 4, 6) * 0.3
    b = torch.randn(6)
    return x_t, state, w, b


def test_available_backends_names_every_backend_with_reason_or_none():
    avail = ck.available_backends()
    assert set(avail) == {"triton", "cpp", "reference"}
    assert avail["reference"] is None
    for name, why in avail.items():
        assert why is None or (isinstance(why, str) and why), name


def test_unknown_backend_is_rejected():
    with pytest.raises(ValueError, match="unknown backend 'cuda-magic'"):
        ck.conv_step(*step_args(), backend="cuda-magic")


def test_env_var_forces_backend(monkeypatch):
    args = step_args()
    monkeypatch.setenv(dispatch.ENV_VAR, "reference")
    assert dispatch.selected_backend_name("conv_step", torch.device("cpu"), None, *args) == "reference"
    monkeypatch.setenv(dispatch.ENV_VAR, "nonsense")
    with pytest.raises(ValueError, match=dispatch.ENV_VAR):
        ck.conv_step(*args)


def test_explicit_backend_that_cannot_run_lists_reasons():
    # bf16 on CPU tensors: triton refuses (the interpreter has no bf16; or no GPU / no triton at all)
    x, w = torch.randn(1, 3, 4, dtype=torch.bfloat16), torch.randn(3, 4, 6, dtype=torch.bfloat16)
    with pytest.raises(ck.BackendUnavailableError, match="backend 'triton' cannot run conv_glu: triton"):
        ck.conv_glu(x, w, causal=True, backend="triton")


def test_auto_never_picks_the_triton_interpreter_on_cpu():
    x, w = torch.randn(1, 3, 4, dtype=torch.float16), torch.randn(3, 4, 6, dtype=torch.float16)
    # cpp has no fp16: auto goes to the reference, not to the (slow) interpreter
    assert dispatch.selected_backend_name("conv_glu", x.device, None, x, w, causal=True) == "reference"


def test_auto_falls_back_when_grad_is_needed():
    args = step_args(requires_grad=True)
    name = dispatch.selected_backend_name("conv_step", torch.device("cpu"), None, *args)
    assert name == "reference"
    out, _ = ck.conv_step(*args)
    out.sum().backward()
    assert args[0].grad is not None


def test_auto_prefers_cpp_for_inference_when_built():
    require_or_skip("cpp")
    with torch.no_grad():
        assert dispatch.selected_backend_name("conv_step", torch.device("cpu"), None, *step_args()) == "cpp"


def test_cpp_disable_env(monkeypatch):
    monkeypatch.setenv("CONVS2S_KERNELS_DISABLE_CPP", "1")
    assert "disabled" in ck.available_backends()["cpp"]
    with torch.no_grad():
        assert dispatch.selected_backend_name("conv_step", torch.device("cpu"), None, *step_args()) == "reference"


def test_capability_derives_every_reason():
    """One declaration gives the refusals: device, dtype, rows, gradients, and the extra check."""
    cap = dispatch.Capability({"cpu": (torch.float32,)}, rows=(1, 4), extra=lambda x, w: ["w is odd"] if w.shape[0] % 2 else [])
    ok = torch.randn(3, 5), torch.randn(6, 5)
    assert cap.reasons("demo op", ok, *ok) == []
    why = cap.reasons("demo op", (torch.randn(2, 5).double(),), torch.randn(2, 5), torch.randn(6, 5))
    assert why == ["demo op takes torch.float32 on cpu, got torch.float64"]
    why = cap.reasons("demo op", (torch.randn(9, 5),), torch.randn(9, 5), torch.randn(7, 5))
    assert why == ["demo op takes 1..4 rows of a 2-D input (decoding), got shape (9, 5)", "w is odd"]
    grad = torch.randn(2, 5, requires_grad=True)
    assert cap.reasons("demo op", (grad,), grad, ok[1]) == ["demo op has no backward; inputs require grad"]
    with torch.no_grad():
        assert cap.reasons("demo op", (grad,), grad, ok[1]) == []
    meta = torch.empty(2, 5, device="meta")
    assert cap.reasons("demo op", (meta,), meta, ok[1]) == ["demo op runs CPU tensors, got meta"]


def test_every_cpp_refusal_comes_from_its_capability():
    cpu = torch.device("cpu")
    x16 = torch.randn(2, 4).half()
    assert ck.backend_reasons("cpp", "linear", cpu, x16, torch.randn(3, 4).half()) == [
        "cpp linear takes torch.float32, torch.bfloat16 on cpu, got torch.float16"]
    if ck.available_backends()["cpp"] is None:
        assert ck.backend_reasons("cpp", "linear", cpu, torch.randn(8, 4), torch.randn(3, 4)) == []


def test_count_dispatches_records_the_backend_that_ran_each_call():
    """Benchmarks label rows by these counts: a preference list that falls back shows it."""
    if ck.available_backends()["cpp"] is not None:
        pytest.fail(f"the cpp backend is required here: {ck.available_backends()['cpp']}")
    x = torch.randn(3, 16)
    w, b = torch.randn(24, 16), torch.randn(24)
    with ck.count_dispatches() as outer:
        with ck.count_dispatches() as inner:
            ck.linear(x, w, b, backend="cpp,reference")                   # 3 rows: cpp
            ck.linear(x, w.clone().requires_grad_(), b, backend="cpp,reference")  # needs a gradient: reference
            ck.conv_step(*step_args(), backend="reference")
        ck.linear(x, w, b, backend="reference")
    assert inner == {("linear", "cpp"): 1, ("linear", "reference"): 1, ("conv_step", "reference"): 1}
    assert outer == {("linear", "cpp"): 1, ("linear", "reference"): 2, ("conv_step", "reference"): 1}
    # nothing is counted outside a block, and asking which backend would run counts nothing
    ck.linear(x, w, b)
    with ck.count_dispatches() as none:
        dispatch.selected_backend_name("linear", x.device, None, x, w, b)
    assert none == {}


def test_note_variant_relabels_the_call_just_counted():
    """A backend with two algorithms names the one that ran (the cpp convolution's Winograd tiles):
    the call moves from ``(op, backend)`` to ``(op, "backend, variant")``; with nothing counted for
    the pair, nothing changes."""
    x, w, b = torch.randn(3, 16), torch.randn(24, 16), torch.randn(24)
    with ck.count_dispatches() as counts:
        dispatch.note_variant("linear", "cpp", "nothing counted yet")
        assert counts == {}
        for _ in range(2):
            ck.linear(x, w, b, backend="cpp,reference")
        name = dispatch.selected_backend_name("linear", x.device, "cpp,reference", x, w, b)
        dispatch.note_variant("linear", name, "second way")
    assert counts == {("linear", name): 1, ("linear", f"{name}, second way"): 1}


def test_bind_runs_the_chosen_implementation_and_counts_every_call():
    """A bound op (a decoding step's repeated call) runs what resolve picks for the first inputs,
    without re-checking, and is counted per call like a dispatched one."""
    x, w, b = torch.randn(3, 8), torch.randn(5, 8), torch.randn(5)
    name = dispatch.selected_backend_name("linear", x.device, "cpp,reference", x, w, b)
    with ck.count_dispatches() as counts:
        fn = dispatch.bind("linear", x.device, "cpp,reference", x, w, b)
        assert counts == {}  # binding itself runs nothing
        out = [fn(torch.randn(r, 8), w, b) for r in (3, 7)]
    assert counts == {("linear", name): 2}
    assert [o.shape for o in out] == [(3, 5), (7, 5)]
    with pytest.raises(dispatch.BackendUnavailableError, match="cannot run linear"):
        dispatch.bind("linear", x.device, "cpp", x.double().requires_grad_(), w.double(), b.double())


def test_bound_calls_check_each_key_once_then_call_the_bound_implementation(monkeypatch):
    """The first call of each key runs the public function (checks included), later ones the bound
    implementation; every call is counted."""
    checked = []
    real = ck.linear

    def linear(*args, **kwargs):  # the public function, recording that its checks ran
        checked.append(args[0].shape[0])
        return real(*args, **kwargs)

    linear.__name__ = "linear"
    calls = dispatch.BoundCalls()
    w, b = torch.randn(5, 8), torch.randn(5)
    with ck.count_dispatches() as counts:
        outs = [calls(linear, rows, w.device, torch.randn(rows, 8), w, b, backend="cpp,reference")
                for rows in (3, 3, 3, 4, 4)]
    assert checked == [3, 4] and [o.shape[0] for o in outs] == [3, 3, 3, 4, 4]
    assert sum(counts.values()) == 5 and all(op == "linear" for op, _ in counts)
    with pytest.raises(ValueError, match="weight expects 8 input features"):
        calls(linear, 6, w.device, torch.randn(6, 9), w, b, backend="cpp,reference")  # a new key is checked
    checked.clear()
    with torch.autocast("cpu", dtype=torch.bfloat16):  # the public function's casts: every call through it
        for _ in range(2):
            calls(linear, 3, w.device, torch.randn(3, 8), w, b, backend="reference")
    assert checked == [3, 3]
