"""``linear``: the cpp backend against ``F.linear`` (the few-row kernel's rows, the GEMM's beyond
them, fp32 and bf16, ragged sizes, leading dimensions, no rows), its fallback where it does not
apply, and the raw kernel's own refusals. The kernels alone: test_few_rows_kernels.py."""

import pytest
import torch

import convs2s_kernels as ck
from convs2s_kernels.testing import assert_close
from harness import require_or_skip, runnable


@pytest.mark.parametrize("rows", [1, 2, 5, 8])
@pytest.mark.parametrize("backend", ["cpp"])  # Triton has no linear: on GPUs it is a cuBLAS GEMM
@torch.no_grad()
def test_linear_matches_reference(backend, rows):
    x, w, b = torch.randn(rows, 96), torch.randn(200, 96) / 10, torch.randn(200)
    runnable(backend, "linear", x, w, b)
    assert_close("linear", ck.linear(x, w, b, backend=backend), ck.linear_ref(x.double(), w.double(), b.double()))


@pytest.mark.parametrize("rows", range(1, 9))
@pytest.mark.parametrize("K,N", [(300, 77), (16, 16), (1, 5), (513, 1030)])
@torch.no_grad()
def test_cpp_linear_every_row_count_and_ragged_sizes(rows, K, N):
    g = torch.Generator().manual_seed(rows * 1000 + K)
    x = torch.randn(rows, K, generator=g)
    w = torch.randn(N, K, generator=g) / K ** 0.5
    b = torch.randn(N, generator=g)
    runnable("cpp", "linear", x, w, b)
    torch.testing.assert_close(ck.linear(x, w, b, backend="cpp"), torch.nn.functional.linear(x, w, b),
                               atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(ck.linear(x, w, backend="cpp"), torch.nn.functional.linear(x, w), atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("backend", ["cpp", "reference"])
@torch.no_grad()
def test_linear_with_the_packed_weight_matches_reference(backend, dtype):
    """``packed=pack_linear_weight(weight)``: the cpp kernel reads it at the row counts the kernel
    choice gives it (unmeasured: up to 8 rows; the GEMM on the weight beyond), the reference
    ignores it; ragged N, strided and 3-D rows."""
    for K, N in ((300, 77), (1, 5), (513, 1030), (64, 130)):
        g = torch.Generator().manual_seed(K + N)
        w = (torch.randn(N, K, generator=g) / K ** 0.5).to(dtype)
        b = torch.randn(N, generator=g).to(dtype)
        packed = ck.pack_linear_weight(w)
        if packed is None:
            assert backend == "reference", "the cpp backend packs float32 and bf16 weights"
            pytest.skip("no cpp extension: nothing packs the weight")
        for rows in (1, 5, 8, 9, 23, 64, 70):
            x = torch.randn(rows, K + 3, generator=g)[:, 2:K + 2].to(dtype)  # rows with a stride
            runnable(backend, "linear", x, w, b)
            got = ck.linear(x, w, b, packed=packed, backend=backend)
            want = torch.nn.functional.linear(x.double(), w.double(), b.double())
            tol = dict(atol=2e-5, rtol=1e-4) if dtype == torch.float32 else dict(atol=3e-2, rtol=2e-2)
            assert got.dtype == dtype
            torch.testing.assert_close(got.double(), want, **tol)
        x3 = torch.randn(2, 3, K, generator=g).to(dtype)
        assert ck.linear(x3, w, None, packed=packed, backend=backend).shape == (2, 3, N)


def test_linear_refuses_a_packing_of_another_weight():
    w = torch.randn(40, 30)
    packed = ck.pack_linear_weight(w)
    if packed is None:
        pytest.skip("no cpp extension: nothing packs the weight")
    x = torch.randn(2, 30)
    with pytest.raises(ValueError, match="packed is not pack_linear_weight"):
        ck.linear(x, w + 1, packed=packed, backend="cpp")
    with pytest.raises(ValueError, match="not pack_linear_weight of this"):
        ck.linear(torch.randn(2, 20), w[:, :20].contiguous(), packed=packed, backend="cpp")
    with pytest.raises(ValueError, match="packed must be pack_linear_weight"):
        ck.linear(x, w, packed=packed.double(), backend="cpp")
    assert ck.pack_linear_weight(w.double()) is None
    with pytest.raises(ValueError, match="takes an \\(N, K\\) weight"):
        ck.pack_linear_weight(w[0])


def test_linear_takes_the_packing_of_a_weight_holding_nan():
    # a diverged checkpoint's packing is still its packing (compared bit for bit, not as numbers)
    w = torch.randn(40, 30)
    w[3, 7] = float("nan")
    packed = ck.pack_linear_weight(w)
    if packed is None:
        pytest.skip("no cpp extension: nothing packs the weight")
    x = torch.randn(2, 30)
    got = ck.linear(x, w, packed=packed, backend="cpp")
    want = torch.nn.functional.linear(x, w)
    torch.testing.assert_close(got, want, equal_nan=True, atol=1e-5, rtol=1e-5)
    assert got[:, 3].isnan().all() and not got[:, :3].isnan().any()


@torch.no_grad()
def test_cpp_linear_takes_any_rows_and_leading_dims():
    w, b = torch.randn(33, 20) / 5, torch.randn(33)
    for shape in [(0, 20), (90, 20), (3, 4, 20), (2, 70, 20)]:  # no rows; past the kernels; 3-D
        x = torch.randn(*shape)
        runnable("cpp", "linear", x, w, b)
        out = ck.linear(x, w, b, backend="cpp")
        assert out.shape == (*shape[:-1], 33)
        torch.testing.assert_close(out, torch.nn.functional.linear(x, w, b), atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("rows", [2, 5, 8])
@torch.no_grad()
def test_cpp_linear_bf16_matches_a_bf16_linear(rows):
    g = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, 200, generator=g).bfloat16()
    w = (torch.randn(70, 200, generator=g) / 14).bfloat16()
    b = torch.randn(70, generator=g).bfloat16()
    runnable("cpp", "linear", x, w, b)
    out = ck.linear(x, w, b, backend="cpp")
    assert out.dtype == torch.bfloat16
    want = torch.nn.functional.linear(x.double(), w.double(), b.double())
    torch.testing.assert_close(out.double(), want, atol=3e-2, rtol=2e-2)


def test_cpp_linear_kernel_rejects_what_it_cannot_do():
    """The raw kernel refuses what its capability record says the dispatcher must not send it."""
    require_or_skip("cpp")
    native = ck.extension.native()
    with pytest.raises(RuntimeError, match="at least one row"):
        native.small_linear(torch.randn(0, 4), torch.randn(3, 4))
    with pytest.raises(RuntimeError, match="float32 or bf16"):
        native.small_linear(torch.randn(2, 4).double(), torch.randn(3, 4).double())
    assert ck.extension.small_gemm_isa() in ("avx512f", "avx2+fma", "baseline")


def test_linear_falls_back_where_the_cpp_kernel_does_not_apply():
    w = torch.randn(7, 5, requires_grad=True)
    cpu = torch.device("cpu")
    assert not ck.backend_reasons("cpp", "linear", cpu, torch.randn(90, 5), w.detach())  # any rows (GEMM past the few)
    assert ck.backend_reasons("cpp", "linear", cpu, torch.randn(3, 5), w)  # needs a gradient
    out = ck.linear(torch.randn(3, 5), w, backend="cpp,reference")  # falls back, keeps autograd
    out.sum().backward()
    assert w.grad is not None


def test_linear_bad_inputs_name_the_problem():
    with pytest.raises(ValueError, match="weight expects 5 input features but x has 4"):
        ck.linear(torch.randn(2, 4), torch.randn(3, 5))
    with pytest.raises(ValueError, match="bias must have shape"):
        ck.linear(torch.randn(2, 5), torch.randn(3, 5), torch.randn(4))
    with pytest.raises(TypeError, match="x must be a tensor"):
        ck.linear(3.0, torch.randn(3, 5))


@pytest.mark.parametrize("cap,expected", [("avx2", ("avx2+fma", "baseline")), ("baseline", ("baseline",))])
def test_kernels_isa_caps_the_few_row_kernels(cap, expected):
    """``CONVS2S_KERNELS_ISA`` caps the instruction set the few-row kernels pick (so an AVX-512
    machine reproduces an AVX2-only one), and the capped kernels still match the reference."""
    import subprocess
    import sys

    require_or_skip("cpp")
    code = ("import torch, convs2s_kernels as ck\n"
            "x, w, b = torch.randn(5, 300), torch.randn(77, 300) / 17, torch.randn(77)\n"
            "torch.testing.assert_close(ck.linear(x, w, b, backend='cpp'), torch.nn.functional.linear(x, w, b),"
            " atol=2e-5, rtol=1e-4)\n"
            "print(ck.extension.small_gemm_isa())\n")
    env = dict(__import__("os").environ, CONVS2S_KERNELS_ISA=cap)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() in expected


def _gemm_op_that_ran(fn) -> str:
    """Which GEMM library a call reached: the profiler sees torch's oneDNN op by name."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        fn()
    names = {e.name for e in prof.events()}
    return "onednn" if "mkldnn::_linear_pointwise" in names else "blas"


@pytest.mark.parametrize("w_is_nk", [True, False], ids=["nk", "kn"])
@pytest.mark.parametrize("library", ["blas", "onednn"])
@torch.no_grad()
def test_gemm_with_either_library_matches_the_float64_product(library, w_is_nk):
    """The two GEMMs the cpp backend chooses between past its few-row kernels, on strided rows, with
    and without bias: each equals the float64 product to float32 rounding (K = 301 sums)."""
    require_or_skip("cpp")
    native = ck.extension.native()
    if library == "onednn" and not native.onednn_gemm_available():
        with pytest.raises(RuntimeError, match="no oneDNN inner product"):
            native.gemm_with(torch.randn(3, 4), torch.randn(5, 4), None, True, "onednn")
        return
    g = torch.Generator().manual_seed(7)
    x = torch.randn(97, 2 * 301, generator=g)[:, ::2]  # strided rows
    w = torch.randn(83, 301, generator=g) / 17
    b = torch.randn(83, generator=g)
    want = x.double() @ w.double().t()
    weight = w if w_is_nk else w.t().contiguous()
    for bias in (b, None):
        out = native.gemm_with(x, weight, bias, w_is_nk, library)
        torch.testing.assert_close(out.double(), want + (b.double() if bias is not None else 0), atol=2e-5, rtol=1e-5)
    assert _gemm_op_that_ran(lambda: native.gemm_with(x, weight, b, w_is_nk, library)) == library
    with pytest.raises(RuntimeError, match="library must be 'blas' or 'onednn'"):
        native.gemm_with(x, weight, b, w_is_nk, "mkl")


@torch.no_grad()
def test_cpp_linear_past_its_kernels_runs_the_library_measured_for_its_shape_and_rows():
    """The measured GEMM library choice (convs2s_kernels.tune) per row range: rows in a range
    given to oneDNN reach oneDNN's op, the others ATen's GEMM; another shape is untouched; a
    transposed view of a (K, N) matrix is taken as that matrix (form kn, measured apart)."""
    import convs2s_kernels.tune as tune

    require_or_skip("cpp")
    native = ck.extension.native()
    K, N = 72, 56
    w, b = torch.randn(N, K) / 9, torch.randn(N)
    tune.forget()
    try:
        native.set_few_rows_choice(0, "float32", K, N, [False] * native.few_rows_max())  # no few-row kernel
        native.set_gemm_library_choice(0, "float32", K, N, [32, -1], [False, True])
        assert native.gemm_library_choices() == [(0, "float32", K, N, [32, -1], [False, True])]
        want_many = "onednn" if native.onednn_gemm_available() else "blas"
        for rows, want in [(20, "blas"), (32, "blas"), (33, want_many), (300, want_many)]:
            x = torch.randn(rows, K)
            assert _gemm_op_that_ran(lambda: ck.linear(x, w, b, backend="cpp")) == want, rows
            torch.testing.assert_close(ck.linear(x, w, b, backend="cpp"), torch.nn.functional.linear(x, w, b),
                                       atol=2e-5, rtol=1e-4)
        x = torch.randn(100, K)
        torch.backends.mkldnn.enabled = False  # torch's switch turns the oneDNN side off
        try:
            assert _gemm_op_that_ran(lambda: ck.linear(x, w, b, backend="cpp")) == "blas"
        finally:
            torch.backends.mkldnn.enabled = True
        assert _gemm_op_that_ran(lambda: ck.linear(x, w[:-1], b[:-1], backend="cpp")) == "blas"  # unmeasured
        w_kn = torch.randn(K, N) / 9  # a (K, N) matrix as the weight's transposed view: form kn
        native.set_gemm_library_choice(1, "float32", K, N, [-1], [True])
        assert _gemm_op_that_ran(lambda: ck.linear(x, w_kn.t(), b, backend="cpp")) == want_many
        for rows in (3, 100):  # the few-row (K, N) kernel, then the GEMM
            xr = torch.randn(rows, K)
            torch.testing.assert_close(ck.linear(xr, w_kn.t(), b, backend="cpp"), xr @ w_kn + b, atol=2e-5, rtol=1e-4)
        with pytest.raises(RuntimeError, match="increasing row counts"):
            native.set_gemm_library_choice(0, "float32", K, N, [32, 16, -1], [True, True, True])
        with pytest.raises(RuntimeError, match="float32 weights only"):
            native.set_gemm_library_choice(0, "bfloat16", K, N, [-1], [True])
        with pytest.raises(RuntimeError, match="forms 0"):
            native.set_gemm_library_choice(2, "float32", K, N, [-1], [True])
    finally:
        tune.forget()
    assert native.gemm_library_choices() == []
