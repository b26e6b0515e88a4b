"""``linear_w8a8`` and ``quantize_rows_int8``: the cpp kernel against the reference bit for bit
(integer sums are exact on both; few and many rows, odd K and N, strided inputs, repeated rows),
at each instruction-set level, the quantiser's error bound, and the input errors."""

import os
import subprocess
import sys

import pytest
import torch

import convs2s_kernels as ck
from convs2s_kernels.testing import assert_close
from harness import require_or_skip, runnable


def _case(rows, K, N, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, K, generator=gen) * torch.logspace(-2, 1, rows).unsqueeze(1)  # rows of different scales
    w = torch.randn(N, K, generator=gen) / K ** 0.5
    q, s = ck.quantize_int8(w)
    return x, q, s, torch.randn(N, generator=gen)


@pytest.mark.parametrize("rows", [1, 2, 5, 12, 13, 64, 161])
@pytest.mark.parametrize("K,N", [(96, 200), (1536, 64), (33, 7), (65, 130), (512, 1001)])
@torch.no_grad()
def test_linear_w8a8_matches_reference_bit_for_bit(rows, K, N):
    x, q, s, b = _case(rows, K, N)
    runnable("cpp", "linear_w8a8", x, q, s, b)
    out = ck.linear_w8a8(x, q, s, b, backend="cpp")
    want = ck.linear_w8a8_ref(x, q, s, b)
    assert_close("linear_w8a8", out, want)
    assert torch.equal(out, want), "exact integer sums and the same float32 rounding on both"
    # a strided x (every other column of a wider buffer), no bias, leading dims
    wide = torch.randn(rows, 2 * K)
    assert torch.equal(ck.linear_w8a8(wide[:, ::2], q, s, backend="cpp"), ck.linear_w8a8_ref(wide[:, ::2], q, s))
    out = ck.linear_w8a8(x.view(1, rows, K), q, s, b, backend="cpp")
    assert out.shape == (1, rows, N) and torch.equal(out[0], want)


@pytest.mark.parametrize("rows", [1, 4, 5, 6, 16, 33])
@pytest.mark.parametrize("K,N", [(1, 1), (7, 65), (64, 64), (130, 129)])
@torch.no_grad()
def test_every_kernel_matches_the_reference(rows, K, N):
    """The VNNI level has two kernels (reducing sums for few rows, packed weight blocks from
    max(16, K / 8) rows on), and the math library's int8 GEMM serves 10 rows or more where its
    sums are exact; each equals the reference at any rows, whichever the call would pick."""
    x, q, s, b = _case(rows, K, N, seed=rows + K)
    require_or_skip("cpp")
    native = ck.extension.native()
    want = ck.linear_w8a8_ref(x, q, s, b)
    # 2: the math library's int8 GEMM, which auto takes from 10 rows where its sums are exact
    for kernel in (0, 1) + ((2,) if native.linear_w8a8_library_exact() else ()):
        assert torch.equal(native.linear_w8a8_with(x, q, s, b, kernel), want), f"kernel {kernel}"
        assert torch.equal(native.linear_w8a8_with(x, q, s, None, kernel), ck.linear_w8a8_ref(x, q, s))


@torch.no_grad()
def test_repeated_and_zero_rows():
    """Beam rows repeat their parents: equal rows give equal outputs; a row of zeros gives the bias."""
    x, q, s, b = _case(6, 300, 77)
    x = x[torch.tensor([0, 0, 3, 3, 3, 5])].clone()
    x[5] = 0
    runnable("cpp", "linear_w8a8", x, q, s, b)
    out = ck.linear_w8a8(x, q, s, b, backend="cpp")
    assert torch.equal(out[0], out[1]) and torch.equal(out[2], out[4])
    assert torch.equal(out[5], b)
    assert torch.equal(out, ck.linear_w8a8_ref(x, q, s, b))


@torch.no_grad()
def test_reference_error_is_bounded_by_both_quantisations():
    """``|y - x W^T| <= sum_k |x_k| |dW| + |dx_k| |W|`` with each quantisation step's half as the error."""
    x, q, s, b = _case(9, 257, 40)
    y = ck.linear_w8a8_ref(x.double(), q, s, b)
    w = q.double() * s.double().unsqueeze(1)
    xq, sx = ck.quantize_rows_int8(x)
    assert xq.dtype == torch.int8 and int(xq.abs().max()) == 127
    assert torch.all((xq.double() * sx.double().unsqueeze(1) - x.double()).abs() <= sx.double().unsqueeze(1) / 2 + 1e-9)
    bound = (x.double().abs() @ (s.double() / 2).expand(257, 40) + (sx.double().unsqueeze(1) / 2) @ w.abs().sum(1, keepdim=True).T)
    exact = x.double() @ w.T + b.double()
    assert torch.all((y.double() - exact).abs() <= bound + 1e-5)


@pytest.mark.parametrize("cap,expected", [("avx2", ("avx2", "baseline")), ("baseline", ("baseline",))])
@pytest.mark.parametrize("onednn_cap", [None, "AVX2"])
def test_kernels_isa_caps_the_int8_kernel(cap, expected, onednn_cap):
    """Under ``CONVS2S_KERNELS_ISA`` the capped kernel runs and still equals the reference; with
    oneDNN capped too (whose AVX2 int8 GEMM saturates int16 pairs) the many-row calls stay exact."""
    require_or_skip("cpp")
    code = ("import torch, convs2s_kernels as ck\n"
            "from convs2s_kernels.extension import int8_kernel_isa\n"
            "for rows, K, N in ((1, 33, 7), (5, 96, 200), (13, 1536, 64), (70, 65, 130), (40, 320, 72)):\n"
            "    x, w, b = torch.randn(rows, K) * 5, torch.randn(N, K) / K ** 0.5, torch.randn(N)\n"
            "    q, s = ck.quantize_int8(w)\n"
            "    q[:, ::3] = 127  # full-scale weights: int16 pairs saturate on a vpmaddubsw path\n"
            "    assert torch.equal(ck.linear_w8a8(x, q, s, b, backend='cpp'), ck.linear_w8a8_ref(x, q, s, b))\n"
            "print(int8_kernel_isa())\n")
    env = dict(os.environ, CONVS2S_KERNELS_ISA=cap, **({"ONEDNN_MAX_CPU_ISA": onednn_cap} if onednn_cap else {}))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() in expected


def test_cpp_refuses_what_it_cannot_take():
    x, q, s, _ = _case(2, 8, 4)
    assert ck.backend_reasons("cpp", "linear_w8a8", x.device, x.double(), q, s)
    assert ck.backend_reasons("cpp", "linear_w8a8", x.device, x, q, s.double())


def test_linear_w8a8_errors_name_the_problem():
    x, q, s, _ = _case(2, 8, 4)
    with pytest.raises(TypeError, match="qweight must be int8"):
        ck.linear_w8a8(x, q.float(), s)
    with pytest.raises(ValueError, match="qweight expects 8 input features but x has 5"):
        ck.linear_w8a8(torch.randn(2, 5), q, s)
    with pytest.raises(ValueError, match="scale must have shape"):
        ck.linear_w8a8(x, q, s[:3])
    bad = q.clone()
    bad[1, 2] = -128
    with pytest.raises(ValueError, match="qweight holds -128: linear_w8a8 takes int8 weights in \\[-127, 127\\]"):
        ck.linear_w8a8(x, bad, s)
