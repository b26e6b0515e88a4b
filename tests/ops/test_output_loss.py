"""``output_loss``: the cpp backend (logits a block of rows at a time, gradients made with the
loss) against the reference (the whole logits, log-softmax, autograd), in float64, float32 and
bfloat16 (autocast's), forward and backward: odd sizes, several blocks, strided inputs, ignored
rows, no bias, label smoothing on and off, a scaled incoming gradient, and the no-gradient path of
validation."""

import pytest
import torch

import convs2s_kernels as ck
from convs2s_kernels.ops.output_loss import cpp as output_loss_cpp
from harness import relative_error, runnable

PAD = 1


def inputs(n, c, v, dtype, seed, strided=False):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, c + 3 if strided else c, generator=g, dtype=dtype)
    x = x[:, 1:c + 1] if strided else x
    w = torch.randn(v, c, generator=g, dtype=dtype) / c ** 0.5
    b = torch.randn(v, generator=g, dtype=dtype)
    target = torch.randint(0, v, (n,), generator=g)
    target[::4] = PAD  # ignored rows, among them the first
    return x, w, b, target


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
@pytest.mark.parametrize("eps", [0.0, 0.1])
@pytest.mark.parametrize("n,c,v", [(1, 3, 5), (37, 16, 23), (130, 31, 257)])
@pytest.mark.parametrize("strided", [False, True], ids=["contiguous", "strided"])
def test_cpp_matches_reference_float64_forward_and_backward(n, c, v, eps, bias, strided, monkeypatch):
    monkeypatch.setattr(output_loss_cpp, "BLOCK_ROWS", 16)  # several blocks and a ragged last one
    x, w, b, target = inputs(n, c, v, torch.float64, n * 100 + v, strided)
    b = b if bias else None
    runnable("cpp", "output_loss", x, w, b, target)
    results = []
    for backend in ("cpp", "reference"):
        leaves = [t.detach().clone().requires_grad_() for t in (x, w) + ((b,) if bias else ())]
        loss, nll = ck.output_loss(leaves[0], leaves[1], leaves[2] if bias else None, target, label_smoothing=eps,
                                   backend=backend)
        assert not nll.requires_grad
        grads = torch.autograd.grad(loss * 1.7, leaves)  # an incoming gradient other than 1
        results.append((loss.detach(), nll, grads))
    (loss, nll, grads), (want_loss, want_nll, want_grads) = results
    torch.testing.assert_close(loss, want_loss, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(nll, want_nll, rtol=1e-12, atol=1e-12)
    for got, want in zip(grads, want_grads):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)


def test_cpp_float32_matches_the_float64_reference():
    x, w, b, target = inputs(600, 64, 1001, torch.float32, 7)  # 600 rows: two blocks of the default size
    leaves = [t.clone().requires_grad_() for t in (x, w, b)]
    loss, nll = ck.output_loss(*leaves, target, label_smoothing=0.1, backend="cpp")
    grads = torch.autograd.grad(loss, leaves)
    ref = [t.double().requires_grad_() for t in (x, w, b)]
    want, want_nll = ck.output_loss_ref(*ref, target, label_smoothing=0.1)
    want_grads = torch.autograd.grad(want, ref)
    assert loss.dtype == torch.float32
    torch.testing.assert_close(loss.double(), want, rtol=1e-6, atol=1e-4)
    torch.testing.assert_close(nll.double(), want_nll, rtol=1e-6, atol=1e-4)
    for got, w64 in zip(grads, want_grads):
        torch.testing.assert_close(got.double(), w64, rtol=1e-4, atol=1e-5)


def float32_against_float64(n, c, v, eps, bias, strided, seed=0):
    """The cpp float32 loss, nll and gradients (its fused passes) against the float64 reference."""
    x, w, b, target = inputs(n, c, v, torch.float32, seed, strided)
    b = b if bias else None
    leaves = [t.detach().clone().requires_grad_() for t in (x, w) + ((b,) if bias else ())]
    loss, nll = ck.output_loss(leaves[0], leaves[1], leaves[2] if bias else None, target, label_smoothing=eps,
                               backend="cpp")
    grads = torch.autograd.grad(loss * 1.7, leaves)
    ref = [t.detach().double().requires_grad_() for t in leaves]
    want, want_nll = ck.output_loss_ref(ref[0], ref[1], ref[2] if bias else None, target, label_smoothing=eps)
    want_grads = torch.autograd.grad(want * 1.7, ref)
    torch.testing.assert_close(loss.double(), want, rtol=2e-6, atol=1e-5)
    torch.testing.assert_close(nll.double(), want_nll, rtol=2e-6, atol=1e-5)
    for got, w64 in zip(grads, want_grads):
        torch.testing.assert_close(got.double(), w64, rtol=1e-4, atol=2e-6)


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
@pytest.mark.parametrize("eps", [0.0, 0.1])
@pytest.mark.parametrize("n,c,v", [(1, 3, 5), (37, 16, 23), (130, 31, 1001)])  # 1,001 words: two threads' shares
@pytest.mark.parametrize("strided", [False, True], ids=["contiguous", "strided"])
def test_cpp_float32_fused_passes_match_float64(n, c, v, eps, bias, strided, monkeypatch):
    monkeypatch.setattr(output_loss_cpp, "BLOCK_ROWS", 16)  # several blocks and a ragged last one (16 + tails of vectors)
    runnable("cpp", "output_loss", *inputs(n, c, v, torch.float32, 0)[:3], None)
    float32_against_float64(n, c, v, eps, bias, strided, seed=n + v)


@pytest.mark.parametrize("library", ["aten", "onednn"])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
@pytest.mark.parametrize("n,c,v", [(37, 16, 23), (130, 31, 1001)])
def test_cpp_float32_on_each_gemm_library_matches_float64(n, c, v, bias, library, monkeypatch):
    """Both libraries the float32 products can run on (the measured choice picks one per machine):
    the bias added in the fused passes, dw written by the first block and summed over the rest."""
    assert library == "aten" or output_loss_cpp.onednn_usable(), "torch's oneDNN inner product is missing"
    monkeypatch.setenv(output_loss_cpp.GEMM_ENV, library)
    monkeypatch.setattr(output_loss_cpp, "BLOCK_ROWS", 16)  # several blocks and a ragged last one
    assert output_loss_cpp.gemm_choice(v, c) == (library, 16)
    with ck.count_dispatches() as counts:
        float32_against_float64(n, c, v, 0.1, bias, True, seed=n + v)
    label = "cpp" if library == "aten" else "cpp, onednn GEMM, 16-row blocks"
    assert counts[("output_loss", label)] == 1, dict(counts)


def test_gemm_choice_is_measured_once_per_machine_and_cached(monkeypatch, tmp_path):
    """auto: the candidates timed once (here a stand-in timing), the pick kept in the kernel-choice
    cache and read back by a fresh process's lookup; with tuning off, ATen's; bad values refused."""
    from convs2s_kernels.tune import policy

    monkeypatch.delenv(output_loss_cpp.GEMM_ENV, raising=False)
    monkeypatch.setenv("CONVS2S_TUNE_CACHE", str(tmp_path))
    monkeypatch.setattr(output_loss_cpp, "_chosen", {})
    monkeypatch.setattr(output_loss_cpp, "onednn_usable", lambda: True)
    with policy.measuring(False):
        assert output_loss_cpp.gemm_choice(77, 9) == ("aten", output_loss_cpp.BLOCK_ROWS)
    calls = []

    def fake_measure(v, c):
        calls.append((v, c))
        return {"aten:512": 1.0, "onednn:512": 0.95, "onednn:1024": 0.9}

    monkeypatch.setattr(output_loss_cpp, "measure_candidates", fake_measure)
    with policy.measuring(True):
        assert output_loss_cpp.gemm_choice(91, 13) == ("onednn", 1024)
        assert output_loss_cpp.gemm_choice(91, 13) == ("onednn", 1024)
        monkeypatch.setattr(output_loss_cpp, "_chosen", {})  # a new process: the cache answers
        assert output_loss_cpp.gemm_choice(91, 13) == ("onednn", 1024)
    assert calls == [(91, 13)]
    assert list(tmp_path.glob("output-loss-gemm-*.json"))
    for bad in ("mkl", "1"):
        monkeypatch.setenv(output_loss_cpp.GEMM_ENV, bad)
        with pytest.raises(ValueError, match="CONVS2S_OUTPUT_LOSS_GEMM must be auto, aten or onednn"):
            output_loss_cpp.gemm_choice(91, 13)


def test_gemm_choice_keeps_aten_unless_another_is_clearly_faster():
    pick = output_loss_cpp.pick_candidate
    assert pick({"aten:512": 1.0, "onednn:512": 0.98, "onednn:1024": 0.99}) == ("aten", 512)  # within the margin
    assert pick({"aten:512": 1.0, "onednn:512": 0.90, "onednn:1024": 0.93}) == ("onednn", 512)
    assert pick({"aten:512": 0.8, "onednn:512": 0.90, "onednn:1024": 0.93}) == ("aten", 512)


def test_gemm_candidates_time_the_real_op():
    """The measurement runs every candidate on the extension and returns a positive time each."""
    seconds = output_loss_cpp.measure_candidates(300, 16, rows=40, rounds=1)
    assert set(seconds) == {f"{lib}:{block or output_loss_cpp.BLOCK_ROWS}" for lib, block in output_loss_cpp.CANDIDATES}
    assert all(t > 0 for t in seconds.values())


def test_cpp_float32_sums_hold_at_a_wmt_sized_vocabulary():
    """40,000 words: the column sums come in blocks, so the loss stays within float32's reach of float64's."""
    float32_against_float64(24, 16, 40000, 0.1, True, False, seed=5)


@pytest.mark.parametrize("n,c,v", [(37, 16, 23), (600, 64, 1001)])  # 600 rows: two blocks of the default size
def test_cpp_bfloat16_matches_the_float64_reference_on_its_inputs(n, c, v):
    """bf16 (autocast's dtype): products in bf16, passes in float32; a float32 loss within bf16's
    rounding of the logits of the float64 reference on the same (bf16-rounded) inputs."""
    x, w, b, target = (t.bfloat16() if t.is_floating_point() else t for t in inputs(n, c, v, torch.float32, n))
    runnable("cpp", "output_loss", x, w, b, target)
    leaves = [t.clone().requires_grad_() for t in (x, w, b)]
    loss, nll = ck.output_loss(*leaves, target, label_smoothing=0.1, backend="cpp")
    assert loss.dtype == torch.float32 and nll.dtype == torch.float32
    grads = torch.autograd.grad(loss * 1.7, leaves)
    ref = [t.double().requires_grad_() for t in (x, w, b)]
    want, want_nll = ck.output_loss_ref(*ref, target, label_smoothing=0.1)
    want_grads = torch.autograd.grad(want * 1.7, ref)
    torch.testing.assert_close(loss.double(), want, rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(nll.double(), want_nll, rtol=1e-2, atol=1e-2)
    plain = [t.clone().requires_grad_() for t in (x, w, b)]  # the reference in bf16: autocast's own rounding
    plain_grads = torch.autograd.grad(ck.output_loss_ref(*plain, target, label_smoothing=0.1)[0] * 1.7, plain)
    for name, got, w64, bf in zip("xwb", grads, want_grads, plain_grads):
        assert got.dtype == torch.bfloat16, name
        assert relative_error(got, w64) < max(2 * relative_error(bf, w64), 1e-2), name


def test_cpp_under_bf16_autocast_trains_the_float32_weights():
    """The trainer's path: float32 leaves, autocast casts them to bf16 and the gradients back."""
    x, w, b, target = inputs(300, 32, 501, torch.float32, 11)
    got = {}
    for backend in ("cpp", "reference"):
        leaves = [t.clone().requires_grad_() for t in (x, w, b)]
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss, _ = ck.output_loss(*leaves, target, label_smoothing=0.1, backend=backend)
        got[backend] = (loss, torch.autograd.grad(loss, leaves))
    ref = [t.double().requires_grad_() for t in (x, w, b)]
    want = ck.output_loss_ref(*ref, target, label_smoothing=0.1)[0]
    want_grads = torch.autograd.grad(want, ref)
    for backend, (loss, grads) in got.items():
        assert loss.dtype == torch.float32 and all(g.dtype == torch.float32 for g in grads), backend
        assert abs(loss.item() - want.item()) < 1e-2 * abs(want.item()), backend
        for name, g, w64 in zip("xwb", grads, want_grads):
            assert relative_error(g, w64) < 3e-2, (backend, name)


_ISA_CODE = """
import sys
sys.path.insert(0, sys.argv[1])
import test_output_loss as t
from convs2s_kernels.ops.output_loss import cpp
cpp.BLOCK_ROWS = 16
for n, c, v in [(37, 16, 23), (130, 31, 1001)]:
    for eps in (0.0, 0.1):
        t.float32_against_float64(n, c, v, eps, True, True, seed=n)
    t.test_cpp_bfloat16_matches_the_float64_reference_on_its_inputs(n, c, v)  # the bf16 block's kernels
"""


@pytest.mark.parametrize("cap", ["avx2", "baseline"])
def test_cpp_float32_fused_passes_at_lower_instruction_sets(cap):
    """The same checks with the kernels capped to a lower instruction set (their other compiled copies)."""
    from harness import assert_runs_at_isa
    assert_runs_at_isa(_ISA_CODE, cap)


@pytest.mark.parametrize("backend", ["cpp", "reference"])
def test_without_gradients_only_the_loss_is_made(backend):
    x, w, b, target = inputs(50, 8, 30, torch.float64, 3)
    with torch.no_grad():
        loss, nll = ck.output_loss(x, w, b, target, label_smoothing=0.1, backend=backend)
    want, want_nll = ck.output_loss_ref(x, w, b, target, label_smoothing=0.1)
    torch.testing.assert_close(loss, want.detach())
    torch.testing.assert_close(nll, want_nll)


def test_bad_inputs_are_refused_in_the_callers_terms():
    x, w, b, target = inputs(5, 4, 9, torch.float32, 1)
    with pytest.raises(ValueError, match="weight expects 4 input features but x has 3"):
        ck.output_loss(x[:, :3], w, b, target)
    with pytest.raises(TypeError, match="target must be a 1-D integer tensor"):
        ck.output_loss(x, w, b, target.float())
    with pytest.raises(ValueError, match=r"target"):
        ck.output_loss(x, w, b, target[:4])
    with pytest.raises(ValueError, match=r"label_smoothing must lie in \[0, 1\)"):
        ck.output_loss(x, w, b, target, label_smoothing=1.0)
