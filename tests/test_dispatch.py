"""Backend selection, the environment override, and the errors of the public ops."""

import pytest
import torch

import convs2s_kernels as ck
from convs2s_kernels import dispatch


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
    if ck.available_backends()["cpp"] is not None:
        pytest.skip(f"cpp backend not available: {ck.available_backends()['cpp']}")
    with torch.no_grad():
        assert dispatch.selected_backend_name("conv_step", torch.device("cpu"), None, *step_args()) == "cpp"


def test_cpp_disable_env(monkeypatch):
    monkeypatch.setenv("CONVS2S_KERNELS_DISABLE_CPP", "1")
    assert "disabled" in ck.available_backends()["cpp"]
    with torch.no_grad():
        assert dispatch.selected_backend_name("conv_step", torch.device("cpu"), None, *step_args()) == "reference"


@pytest.mark.parametrize(
    "call,match",
    [
        (lambda: ck.conv_glu(torch.randn(3, 4), torch.randn(3, 4, 6), causal=True), "x must have 3 dimensions"),
        (lambda: ck.conv_glu(torch.randn(1, 3, 5), torch.randn(3, 4, 6), causal=True), "C_in = 4"),
        (lambda: ck.conv_glu(torch.randn(1, 3, 4), torch.randn(3, 4, 5), causal=True), "even last dimension"),
        (lambda: ck.conv_glu(torch.randn(1, 3, 4).double(), torch.randn(3, 4, 6), causal=True), "dtype"),
        (lambda: ck.conv_glu(torch.randint(0, 3, (1, 3, 4)), torch.randn(3, 4, 6), causal=True), "floating-point"),
        (lambda: ck.conv_glu(torch.randn(1, 3, 4), torch.randn(3, 4, 6), causal=True,
                             pad_mask=torch.zeros(1, 3)), "bool"),
        (lambda: ck.conv_glu(torch.randn(1, 3, 4), torch.randn(3, 4, 6), causal=True,
                             residual=torch.randn(1, 3, 4)), "residual must have shape"),
        (lambda: ck.attention_embsum(torch.randn(2, 3, 4), torch.randn(2, 5, 4), torch.randn(2, 5, 4),
                                     torch.tensor([0, 5])), r"src_lengths values must lie in \[1, 5\]"),
        (lambda: ck.attention_embsum(torch.randn(2, 3, 4), torch.randn(2, 5, 4), torch.randn(2, 6, 4)),
         "y must have shape"),
        (lambda: ck.conv_step(torch.randn(2, 4), torch.randn(2, 1, 4), torch.randn(3, 4, 6)), "state must have shape"),
        (lambda: ck.conv_step(torch.randn(3, 4), torch.randn(2, 2, 4), torch.randn(3, 4, 6)), "pass beam_index"),
        (lambda: ck.conv_step(torch.randn(2, 4), torch.randn(2, 2, 4), torch.randn(3, 4, 6),
                              beam_index=torch.tensor([0, 2])), r"beam_index values must lie in \[0, 1\]"),
        (lambda: ck.conv_step(torch.randn(2, 4), torch.randn(2, 2, 4), torch.randn(3, 4, 6),
                              beam_index=torch.tensor([0.0, 1.0])), "int32 or int64"),
    ],
)
def test_bad_inputs_name_the_problem(call, match):
    with pytest.raises((ValueError, TypeError), match=match):
        call()


def test_count_dispatches_records_the_backend_that_ran_each_call():
    """Benchmarks label rows by these counts: a preference list that falls back shows it."""
    if ck.available_backends()["cpp"] is not None:
        pytest.fail(f"the cpp backend is required here: {ck.available_backends()['cpp']}")
    x = torch.randn(3, 16)
    w, b = torch.randn(24, 16), torch.randn(24)
    with ck.count_dispatches() as outer:
        with ck.count_dispatches() as inner:
            ck.linear(x, w, b, backend="cpp,reference")                   # 3 rows: cpp
            ck.linear(torch.randn(9, 16), w, b, backend="cpp,reference")  # 9 rows: over cpp's 8, reference
            ck.conv_step(*step_args(), backend="reference")
        ck.linear(x, w, b, backend="reference")
    assert inner == {("linear", "cpp"): 1, ("linear", "reference"): 1, ("conv_step", "reference"): 1}
    assert outer == {("linear", "cpp"): 1, ("linear", "reference"): 2, ("conv_step", "reference"): 1}
    # nothing is counted outside a block, and asking which backend would run counts nothing
    ck.linear(x, w, b)
    with ck.count_dispatches() as none:
        dispatch.selected_backend_name("linear", x.device, None, x, w, b)
    assert none == {}
