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


@pytest.mark.parametrize("rows", [1, 2, 3, 5, 12, 17, 64, 160])
@pytest.mark.parametrize("K,N", [(1, 1), (7, 65), (96, 200), (130, 129), (512, 1001), (1536, 64)])
@torch.no_grad()
def test_packed_weight_matches_the_reference(rows, K, N):
    """With ``packed`` (the weight laid out once) every kernel that reads it, and auto's choice,
    equals the reference bit for bit, odd K and N included (the layout's zero padding)."""
    x, q, s, b = _case(rows, K, N, seed=3 * rows + N)
    packed = ck.pack_w8a8_weight(q)
    want = ck.linear_w8a8_ref(x, q, s, b)
    runnable("cpp", "linear_w8a8", x, q, s, b)
    assert torch.equal(ck.linear_w8a8(x, q, s, b, packed=packed, backend="cpp"), want)
    assert torch.equal(ck.linear_w8a8(x, q, s, b, packed=packed, backend="reference"), want)
    native = ck.extension.native()
    kernels = (-1, 0, 1) + ((3,) if native.linear_w8a8_isa() == "amx-int8" else ())
    for kernel in kernels:
        assert torch.equal(native.linear_w8a8_with(x, q, s, b, kernel, packed), want), f"kernel {kernel}"
    wide = torch.randn(rows, 2 * K)
    assert torch.equal(ck.linear_w8a8(wide[:, ::2], q, s, packed=packed, backend="cpp"),
                       ck.linear_w8a8_ref(wide[:, ::2], q, s))


@pytest.mark.parametrize("rows", [1, 2, 3, 5, 12, 17, 64])
@pytest.mark.parametrize("K,N", [(1, 1), (7, 65), (130, 129), (512, 1001), (1536, 64)])
@torch.no_grad()
def test_seven_bit_activations_match_the_reference(rows, K, N):
    """``activation_bits=7`` (rows quantised to [-63, 63]; the AVX2 packed kernel then multiplies
    offset activations without vpsignb and subtracts the weight sums of its first row tile): every
    kernel, packed or not, auto's choice and a strided x equal the reference bit for bit, full-scale
    weights of both signs included."""
    x, q, s, b = _case(rows, K, N, seed=5 * rows + K)
    q[:, ::3] = 127
    q[:, 1::5] = -127
    packed = ck.pack_w8a8_weight(q)
    want = ck.linear_w8a8_ref(x, q, s, b, activation_bits=7)
    runnable("cpp", "linear_w8a8", x, q, s, b)
    assert torch.equal(ck.linear_w8a8(x, q, s, b, packed=packed, activation_bits=7, backend="cpp"), want)
    assert torch.equal(ck.linear_w8a8(x, q, s, b, activation_bits=7, backend="cpp"), want)
    native = ck.extension.native()
    for kernel in (-1, 0, 1) + ((3,) if native.linear_w8a8_isa() == "amx-int8" else ()):
        for p in (None, packed) if kernel != 3 else (packed,):
            assert torch.equal(native.linear_w8a8_with(x, q, s, b, kernel, p, 7), want), (kernel, p is None)
    wide = torch.randn(rows, 2 * K) * 3
    assert torch.equal(ck.linear_w8a8(wide[:, ::2], q, s, packed=packed, activation_bits=7, backend="cpp"),
                       ck.linear_w8a8_ref(wide[:, ::2], q, s, activation_bits=7))


@pytest.mark.parametrize("rows", [1, 3, 5, 12, 17, 64])
@pytest.mark.parametrize("K,N", [(7, 65), (130, 129), (512, 1001)])
@pytest.mark.parametrize("activation_bits", [7, 8])
@torch.no_grad()
def test_seven_bit_weights_match_the_reference(rows, K, N, activation_bits):
    """``weight_bits=7`` (the weights of ``quantize_int8(w, bits=7)``, in [-63, 63]): every kernel,
    packed or not, auto's choice and a strided x equal the reference bit for bit; full-scale
    weights of both signs against a full-scale row (the AVX2 kernel's int16 sums at their extremes)."""
    gen = torch.Generator().manual_seed(7 * rows + K)
    x, w, b = torch.randn(rows, K, generator=gen) * 3, torch.randn(N, K, generator=gen), torch.randn(N, generator=gen)
    q, s = ck.quantize_int8(w, bits=7)
    q[0], q[-1] = 63, -63
    x[0] = 5.0
    packed = ck.pack_w8a8_weight(q)
    bits = dict(activation_bits=activation_bits, weight_bits=7)
    want = ck.linear_w8a8_ref(x, q, s, b, activation_bits=activation_bits)
    runnable("cpp", "linear_w8a8", x, q, s, b)
    assert torch.equal(ck.linear_w8a8(x, q, s, b, packed=packed, backend="cpp", **bits), want)
    assert torch.equal(ck.linear_w8a8(x, q, s, b, backend="cpp", **bits), want)
    assert torch.equal(ck.linear_w8a8(x, q, s, b, packed=packed, backend="reference", **bits), want)
    native = ck.extension.native()
    for kernel in (-1, 0, 1) + ((3,) if native.linear_w8a8_isa() == "amx-int8" else ()):
        for p in (None, packed) if kernel != 3 else (packed,):
            assert torch.equal(native.linear_w8a8_with(x, q, s, b, kernel, p, activation_bits, 7), want), kernel
    wide = torch.randn(rows, 2 * K, generator=gen)
    assert torch.equal(ck.linear_w8a8(wide[:, ::2], q, s, packed=packed, backend="cpp", **bits),
                       ck.linear_w8a8_ref(wide[:, ::2], q, s, activation_bits=activation_bits))


@torch.no_grad()
def test_seven_bit_weight_quantiser_range_and_error():
    """``quantize_int8(w, bits=7)``: |q| <= 63 with each row's max at 63, error at most half a step
    (scale = max|w_n| / 63); a zero row gets scale 1; other widths are refused."""
    w = torch.randn(9, 40)
    w[4] = 0
    q, s = ck.quantize_int8(w, bits=7)
    assert q.dtype == torch.int8 and int(q.abs().max()) == 63
    assert bool((q.abs().amax(1)[torch.arange(9) != 4] == 63).all()) and float(s[4]) == 1.0
    assert torch.all((q.double() * s.double().unsqueeze(1) - w.double()).abs() <= s.double().unsqueeze(1) / 2 + 1e-7)
    for bad in (6, 16, True, "7"):
        with pytest.raises(ValueError, match="bits must be 8 or 7, got"):
            ck.quantize_int8(w, bits=bad)


def test_weight_bits_must_be_8_or_7_and_match_the_weight():
    x, q, s, _ = _case(2, 8, 4)
    for bad in (6, 16, True, "7"):
        with pytest.raises(ValueError, match="weight_bits must be 8 or 7, got"):
            ck.linear_w8a8(x, q, s, weight_bits=bad)
    wide = q.clone()
    wide[1, 2] = 64
    with pytest.raises(ValueError, match=r"qweight holds values outside \[-63, 63\]: weight_bits=7 takes"):
        ck.linear_w8a8(x, wide, s, weight_bits=7)
    ck.linear_w8a8(x, wide, s)  # the same weight is fine as 8 bits
    lowest = q.clone()
    lowest[0, 0] = -128  # abs(-128) wraps to -128 in int8: the range is compared, not abs()
    with pytest.raises(ValueError, match=r"outside \[-63, 63\]"):
        ck.linear_w8a8(x, lowest, s, weight_bits=7)
    narrow, ns = ck.quantize_int8(torch.randn(4, 8), bits=7)
    ck.linear_w8a8(x, narrow, ns, weight_bits=7)
    narrow[0, 0] = -64  # an in-place write is checked again
    with pytest.raises(ValueError, match=r"outside \[-63, 63\]"):
        ck.linear_w8a8(x, narrow, ns, weight_bits=7)
    if ck.available_backends()["cpp"] is None:
        with pytest.raises(RuntimeError, match="weight_bits must be 8 or 7, got 6"):
            ck.extension.native().linear_w8a8_with(x, q, s, None, -1, None, 8, 6)


def test_weights_made_under_inference_mode_are_checked_once_too():
    """Inference tensors keep no version counter: their range and packing are still checked (once)."""
    with torch.inference_mode():
        x, q, s, b = _case(3, 16, 8)
        packed = ck.pack_w8a8_weight(q)
        want = ck.linear_w8a8_ref(x, q, s, b)
        assert_close("linear_w8a8", ck.linear_w8a8(x, q, s, b, packed=packed), want)
        assert_close("linear_w8a8", ck.linear_w8a8(x, q, s, b, packed=packed), want)
        bad = q.clone()
        bad[0, 0] = -128
        with pytest.raises(ValueError, match="qweight holds -128"):
            ck.linear_w8a8(x, bad, s, b)
        with pytest.raises(ValueError, match="packed is not pack_w8a8_weight"):
            ck.linear_w8a8(x, q, s, b, packed=ck.pack_w8a8_weight(q.flip(0)))


@torch.no_grad()
def test_seven_bit_quantiser_range_and_error():
    """7 bits: |xq| <= 63 with the row's max at 63, error at most half a step (sx = max|x| / 63),
    about twice the 8-bit step; repeated beam rows stay equal and a zero row gives the bias."""
    x, q, s, b = _case(6, 300, 77)
    xq, sx = ck.quantize_rows_int8(x, bits=7)
    assert int(xq.abs().max()) == 63 and bool((xq.abs().amax(1) == 63).all())
    assert torch.equal(sx, x.abs().amax(1) / 63)
    assert torch.all((xq.double() * sx.double().unsqueeze(1) - x.double()).abs() <= sx.double().unsqueeze(1) / 2 + 1e-9)
    x = x[torch.tensor([0, 0, 3, 3, 3, 5])].clone()
    x[5] = 0
    runnable("cpp", "linear_w8a8", x, q, s, b)
    out = ck.linear_w8a8(x, q, s, b, packed=ck.pack_w8a8_weight(q), activation_bits=7, backend="cpp")
    assert torch.equal(out[0], out[1]) and torch.equal(out[2], out[4]) and torch.equal(out[5], b)
    assert torch.equal(out, ck.linear_w8a8_ref(x, q, s, b, activation_bits=7))


def test_activation_bits_must_be_8_or_7():
    x, q, s, _ = _case(2, 8, 4)
    for bad in (6, 16, True, "7"):
        with pytest.raises(ValueError, match="activation_bits must be 8 or 7, got"):
            ck.linear_w8a8(x, q, s, activation_bits=bad)
        with pytest.raises(ValueError, match="activation_bits must be 8 or 7, got"):
            ck.quantize_rows_int8(x, bits=bad)
    if ck.available_backends()["cpp"] is None:
        with pytest.raises(RuntimeError, match="activation_bits must be 8 or 7, got 6"):
            ck.extension.native().linear_w8a8_with(x, q, s, None, -1, None, 6)


def test_pack_w8a8_weight_layout():
    """``packed[b, k4, c, j] = qweight[64 b + c, 4 k4 + j]``, zero past N and past K rounded to 64;
    then per block one group holding its columns' sums as int32 (zero past N)."""
    q = torch.randint(-127, 128, (70, 9), dtype=torch.int8)
    q[q == 0] = 1
    p = ck.pack_w8a8_weight(q)
    assert p.shape == (2, 17, 64, 4) and p.dtype == torch.int8 and p.is_contiguous()
    for n, k in ((0, 0), (5, 8), (63, 4), (64, 1), (69, 8)):
        assert p[n // 64, k // 4, n % 64, k % 4] == q[n, k]
    groups = p[:, :16]
    assert int(groups.abs().gt(0).sum()) == q.numel(), "every weight once, zeros elsewhere"
    sums = p[:, 16].contiguous().view(torch.int32).reshape(-1)  # (2 blocks x 64 columns)
    assert torch.equal(sums[:70], q.sum(dim=1, dtype=torch.int32)) and not sums[70:].any()
    assert ck.pack_w8a8_weight(torch.ones(1, 65, dtype=torch.int8)).shape == (1, 33, 64, 4)
    with pytest.raises(TypeError, match="pack_w8a8_weight takes an int8 \\(N, K\\) qweight"):
        ck.pack_w8a8_weight(q.float())


@pytest.mark.parametrize("cap", ["avx2", "baseline"])
def test_packed_weight_under_isa_caps(cap):
    """The AVX2 packed kernel (and the baseline, which ignores the layout) equal the reference, with
    8-bit and 7-bit activations and 8-bit and 7-bit weights (the AVX2 kernel's int16 sums of two
    pairs at their extremes); row counts that end in a partial tile of either tile height (two
    rows for 8 bits, three for 7)."""
    require_or_skip("cpp")
    code = ("import torch, convs2s_kernels as ck\n"
            "native = ck.extension.native()\n"
            "for rows, K, N in ((1, 33, 7), (2, 96, 200), (3, 130, 129), (5, 200, 70), (7, 65, 97), (12, 512, 300),\n"
            "                   (161, 64, 65)):\n"
            "    x, w, b = torch.randn(rows, K) * 5, torch.randn(N, K) / K ** 0.5, torch.randn(N)\n"
            "    q, s = ck.quantize_int8(w)\n"
            "    q[:, ::3] = 127  # full-scale weights\n"
            "    q[0] = 127; x[0] = 63.0  # a full-scale row against a full-scale weight row: the int16 pairs' extremes\n"
            "    p, want = ck.pack_w8a8_weight(q), ck.linear_w8a8_ref(x, q, s, b)\n"
            "    want7 = ck.linear_w8a8_ref(x, q, s, b, activation_bits=7)\n"
            "    q7, s7 = ck.quantize_int8(w, bits=7)  # 7-bit weights: two pairs add in int16 on AVX2\n"
            "    q7[0] = 63; q7[-1] = -63  # against the full-scale row: +-2 * 2 * 127 * 63, int16's extremes\n"
            "    p7 = ck.pack_w8a8_weight(q7)\n"
            "    want77 = ck.linear_w8a8_ref(x, q7, s7, b, activation_bits=7)\n"
            "    want87 = ck.linear_w8a8_ref(x, q7, s7, b)\n"
            "    for kernel in (-1, 0, 1):\n"
            "        assert torch.equal(native.linear_w8a8_with(x, q, s, b, kernel, p), want), (rows, K, N, kernel)\n"
            "        for pk in (None, p):  # 7 bits, the weight packed by the caller or per call\n"
            "            assert torch.equal(native.linear_w8a8_with(x, q, s, b, kernel, pk, 7), want7), (rows, K, N, kernel)\n"
            "        for pk in (None, p7):  # 7-bit weights, with 7-bit and 8-bit activations\n"
            "            assert torch.equal(native.linear_w8a8_with(x, q7, s7, b, kernel, pk, 7, 7), want77), (rows, K, N, kernel)\n"
            "            assert torch.equal(native.linear_w8a8_with(x, q7, s7, b, kernel, pk, 8, 7), want87), (rows, K, N, kernel)\n")
    env = dict(os.environ, CONVS2S_KERNELS_ISA=cap, ONEDNN_MAX_CPU_ISA="AVX2")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]


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



@pytest.mark.parametrize("K", [5, 37, 100])
@torch.no_grad()
def test_quantised_rows_round_ties_to_even_like_the_reference(K):
    """Rows whose max is 127 have scale 1, so x / scale lands exactly on halves: the kernels'
    quantiser (vector lanes and the scalar tail alike) must round them to even and clamp as the
    reference does. An identity weight reads the quantised row back: y = xq * sx exactly."""
    halves = (torch.arange(K, dtype=torch.float32) - K // 2) * 0.5 + 0.5  # ..., -0.5, 0.5, 1.5, 2.5, ...
    x = torch.stack([halves.clamp(-126.5, 126.5), halves * 3 % 127 - 63.5, -halves.flip(0)])
    x[:, 0] = 127.0  # |max| = 127 -> scale exactly 1
    x[2, 1] = -127.0
    q = torch.eye(K, dtype=torch.int8)
    s = torch.ones(K)
    runnable("cpp", "linear_w8a8", x, q, s)
    want = ck.linear_w8a8_ref(x, q, s)
    assert torch.equal(want, torch.round(x)), "the reference rounds halves to even"
    assert torch.equal(ck.linear_w8a8(x, q, s, backend="cpp"), want)

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


@pytest.mark.parametrize("cap,expected", [("avx512", ("avx512-vnni", "avx2", "baseline")), ("avx2", ("avx2", "baseline")),
                                          ("baseline", ("baseline",))])
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
            "    want = ck.linear_w8a8_ref(x, q, s, b)\n"
            "    assert torch.equal(ck.linear_w8a8(x, q, s, b, backend='cpp'), want)\n"
            "    assert torch.equal(ck.linear_w8a8(x, q, s, b, packed=ck.pack_w8a8_weight(q), backend='cpp'), want)\n"
            "print(int8_kernel_isa())\n")
    env = dict(os.environ, CONVS2S_KERNELS_ISA=cap, **({"ONEDNN_MAX_CPU_ISA": onednn_cap} if onednn_cap else {}))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() in expected


def test_unknown_isa_value_keeps_the_best_int8_kernel():
    """An unknown ``CONVS2S_KERNELS_ISA`` is ignored with a warning: no level is capped, AMX included."""
    require_or_skip("cpp")
    code = "import convs2s_kernels as ck; print(ck.extension.int8_kernel_isa())"
    runs = {}
    for value in (None, "bogus"):
        env = dict(os.environ)
        env.pop("CONVS2S_KERNELS_ISA", None)
        if value:
            env["CONVS2S_KERNELS_ISA"] = value
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
        assert out.returncode == 0, out.stderr[-2000:]
        runs[value] = out.stdout.strip()
    assert runs["bogus"] == runs[None]


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
    with pytest.raises(ValueError, match=r"packed must be pack_w8a8_weight\(qweight\): int8 \(1, 17, 64, 4\), got"):
        ck.linear_w8a8(x, q, s, packed=torch.zeros(1, 3, 64, 4, dtype=torch.int8))
    other = q.clone()
    other[0, 0] = -other[0, 0] if int(other[0, 0]) else 1
    with pytest.raises(ValueError, match="packed is not pack_w8a8_weight\\(qweight\\)"):
        ck.linear_w8a8(x, q, s, packed=ck.pack_w8a8_weight(other))
    # a view of an already-checked weight (same storage and version) is checked anew
    sq, ss = ck.quantize_int8(torch.randn(8, 8))
    sq_packed = ck.pack_w8a8_weight(sq)
    ck.linear_w8a8(x, sq, ss, packed=sq_packed)
    if not torch.equal(sq, sq.t()):
        with pytest.raises(ValueError, match="packed is not pack_w8a8_weight"):
            ck.linear_w8a8(x, sq.t(), ss, packed=sq_packed)
