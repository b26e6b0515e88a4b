"""The few-row kernels themselves (``csrc/small_gemm.cpp``), called raw at every row count they
take: one register tile, its remainders, several tiles (1..16, 23, 24, 31, 48, 63, 64 rows);
ragged K and N (vector lanes, 64-column blocks, the 16- and 64-row K chunks of the (K, N) layout,
the packed layout's 16- or 64-column blocks and its 64- or 256-row chunks); rows with a stride;
fp32, bf16 and int8 weights; the three weight layouts ((N, K), (K, N), packed (K, N)); and, in a subprocess, every
lower instruction-set level (``CONVS2S_KERNELS_ISA``). Then the measured choice routes calls the
way it says. Tolerances: fp32 against float64 within 1e-4 relative (sums of up to ~1000 products
of unit-scale terms); bf16 outputs within bf16 rounding (2e-2 relative)."""

import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from convs2s_kernels.extension import native
from convs2s_kernels.tune import forget
from harness import require_or_skip

ROWS = list(range(1, 17)) + [23, 24, 31, 48, 63, 64]
# (K, N); 88: a one-vector tile at AVX2; 517 x 1030, 130 x 2050: large enough that two threads
# split K (a ragged last chunk; from 16 rows on a second half of 2 weight rows); 100 x 2700: K too
# short to split in 64-row chunks
SHAPES = [(1, 5), (16, 16), (33, 70), (40, 88), (300, 129), (517, 1030), (130, 2050), (100, 2700)]


@pytest.fixture
def C():
    require_or_skip("cpp")
    return native()


def _operands(rows, K, N, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    wide = torch.randn(rows, K + 7, generator=g)[:, 3:K + 3]  # rows with a stride, as a slice
    w = torch.randn(N, K, generator=g) / K ** 0.5
    b = torch.randn(N, generator=g)
    return wide.to(dtype), w.to(dtype), b.to(dtype)


def _close(got, want, dtype):
    tol = dict(atol=2e-5, rtol=1e-4) if dtype == torch.float32 else dict(atol=3e-2, rtol=2e-2)
    torch.testing.assert_close(got.double(), want, **tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("layout", ["nk", "kn", "packed"])
@torch.no_grad()
def test_float_kernels_every_row_count_and_ragged_shape(C, layout, dtype):
    assert C.few_rows_max() == 64

    def product(x, w, *bias):
        if layout == "nk":
            return C.small_gemm_nk(x, w, *bias)
        if layout == "kn":
            return C.small_gemm_kn(x, w.t().contiguous(), *bias)
        return C.small_gemm_kn_packed(x, C.pack_kn_weight(w.t().contiguous()), w.shape[0], *bias)

    for K, N in SHAPES:
        for rows in ROWS:
            x, w, b = _operands(rows, K, N, dtype, seed=rows * 7919 + K)
            want = F.linear(x.double(), w.double(), b.double())
            got = product(x, w, b)
            assert got.dtype == dtype and got.shape == (rows, N)
            _close(got, want, dtype)
            if rows in (1, 13):  # without a bias too
                _close(product(x, w), F.linear(x.double(), w.double()), dtype)


@torch.no_grad()
def test_the_packed_layout_is_column_blocks_of_the_weight(C):
    """pack_kn_weight's layout, element by element: blocks of the CPU's width (64 columns with the
    AVX-512 kernels, 16 otherwise), each block (K, width) row-major, zero past N; big weights on
    2 MB-aligned (huge-page) memory."""
    width = C.kn_packed_width()
    assert width == (64 if C.small_gemm_isa() == "avx512f" else 16)
    for K, N in ((3, width), (5, 2 * width + 3), (700, 1000)):
        w = torch.randn(K, N)
        p = C.pack_kn_weight(w)
        blocks = -(-N // width)
        assert p.shape == (blocks, K, width) and p.dtype == w.dtype
        padded = torch.zeros(K, blocks * width)
        padded[:, :N] = w
        assert torch.equal(p, padded.view(K, blocks, width).transpose(0, 1))
    assert C.pack_kn_weight(torch.randn(700, 1000)).data_ptr() % (2 << 20) == 0
    big = torch.randn(3, 1 << 20)
    copy = C.huge_page_copy(big[:, ::2])  # strided in, contiguous out
    assert copy.is_contiguous() and torch.equal(copy, big[:, ::2]) and copy.data_ptr() % (2 << 20) == 0
    small = C.huge_page_copy(torch.arange(10.0))
    assert torch.equal(small, torch.arange(10.0))


@torch.no_grad()
def test_packed_kernels_give_the_same_bits_on_any_thread_count(C):
    """The packed kernels deal their column blocks out to the threads in runs as threads come free
    (parallel_runs): each block is computed whole by one thread, so the output must not depend on
    the thread count or the schedule. 2050 columns: a ragged last block and a ragged last run."""
    import convs2s_kernels as ck

    K, N = 130, 2050
    x, w, b = _operands(13, K, N, torch.float32, seed=5)
    packed = C.pack_kn_weight(w.t().contiguous())
    q = torch.randint(-127, 128, (N, K), dtype=torch.int8, generator=torch.Generator().manual_seed(6))
    s = torch.rand(N, generator=torch.Generator().manual_seed(7)) / 127
    q_packed = ck.pack_w8a8_weight(q)
    before = torch.get_num_threads()
    outs = []
    try:
        for threads in (1, 2, 3):
            torch.set_num_threads(threads)
            outs.append((C.small_gemm_kn_packed(x, packed, N, b), C.linear_w8a8(x, q, s, b, q_packed)))
    finally:
        torch.set_num_threads(before)
    _close(outs[0][0], F.linear(x.double(), w.double(), b.double()), torch.float32)
    for fp32, int8 in outs[1:]:
        assert torch.equal(fp32, outs[0][0]) and torch.equal(int8, outs[0][1])


def test_the_packed_kernel_refuses_another_layout(C):
    w = torch.randn(40, 70)
    p = C.pack_kn_weight(w)
    with pytest.raises(RuntimeError, match=r"is not a \(K, N\) = \(41, 70\) weight"):
        C.small_gemm_kn_packed(torch.randn(2, 41), p, 70)
    with pytest.raises(RuntimeError, match=r"is not a \(K, N\)"):
        C.small_gemm_kn_packed(torch.randn(2, 40), p, 70 + C.kn_packed_width())
    other = 16 if C.kn_packed_width() == 64 else 64
    with pytest.raises(RuntimeError, match=f"packed {other} columns a block, this CPU's kernels take"):
        C.small_gemm_kn_packed(torch.randn(2, 40), torch.zeros(-(-70 // other), 40, other), 70)
    with pytest.raises(RuntimeError, match="at least one row"):
        C.small_gemm_kn_packed(torch.randn(0, 40), p, 70)
    with pytest.raises(RuntimeError, match="share a dtype"):
        C.small_gemm_kn_packed(torch.randn(2, 40, dtype=torch.float64), p, 70)


@torch.no_grad()
def test_the_packed_kernel_takes_any_rows_in_pieces_of_its_cap(C):
    # past 64 rows, pieces of 64 (each reading the whole weight); strided rows, ragged N, bias
    w, b = torch.randn(40, 70) / 7, torch.randn(70)
    p = C.pack_kn_weight(w)
    for rows in (64, 65, 129, 200):
        x = torch.randn(rows, 43)[:, 1:41]
        torch.testing.assert_close(C.small_gemm_kn_packed(x, p, 70, b), F.linear(x.double(), w.t().double(), b.double()).float(),
                                   atol=2e-5, rtol=1e-4)


@torch.no_grad()
def test_int8_kernel_every_row_count_and_ragged_shape(C):
    for K, N in SHAPES:
        for rows in ROWS:
            x, w, b = _operands(rows, K, N, torch.float32, seed=rows * 31 + N)
            q = torch.randint(-127, 128, (N, K), dtype=torch.int8, generator=torch.Generator().manual_seed(rows))
            s = torch.rand(N, generator=torch.Generator().manual_seed(K)) / 127
            want = F.linear(x.double(), q.double() * s.double().unsqueeze(1), b.double())
            _close(C.small_gemm_int8(x, q, s, b), want, torch.float32)


def test_kernels_refuse_more_rows_than_they_take(C):
    with pytest.raises(RuntimeError, match="1..64 rows"):
        C.small_gemm_nk(torch.randn(65, 4), torch.randn(3, 4))
    with pytest.raises(RuntimeError, match="1..64 rows"):
        C.small_gemm_int8(torch.randn(65, 4), torch.zeros(3, 4, dtype=torch.int8), torch.ones(3), None)


@pytest.mark.parametrize("cap,expected", [("avx2", ("avx2+fma", "baseline")), ("baseline", ("baseline",))])
def test_every_lower_instruction_set_passes_the_same_tests(C, cap, expected):
    """The kernels are compiled three times; an AVX-512 machine checks its AVX2 and baseline
    copies by capping them (the same tests, in a subprocess that loads the extension capped)."""
    env = dict(os.environ, CONVS2S_KERNELS_ISA=cap)
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", __file__, "-k",
                          "float_kernels or int8_kernel or refuse or packed", "-W", "ignore"],
                         capture_output=True, text=True, env=env, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    isa = subprocess.run([sys.executable, "-c", "import convs2s_kernels as ck; print(ck.extension.small_gemm_isa())"],
                         capture_output=True, text=True, env=env, timeout=120).stdout.strip()
    assert isa in expected


@torch.no_grad()
def test_the_measured_choice_routes_each_row_count(C):
    """A choice handed to the extension decides, per row count, between the kernel and ATen's
    GEMM (bit-for-bit the one or the other); a shape never measured takes the kernel up to 8 rows."""
    K, N = 300, 24
    g = torch.Generator().manual_seed(5)
    w, b = torch.randn(N, K, generator=g), torch.randn(N, generator=g)
    rows_on_kernel = [r % 3 == 0 for r in range(1, 65)]
    C.set_few_rows_choice(0, "float32", K, N, rows_on_kernel)
    try:
        assert (0, "float32", K, N, rows_on_kernel) in C.few_rows_choices()
        for rows in (1, 3, 4, 9, 64):
            x = torch.randn(rows, K, generator=g)
            kernel, gemm = C.small_gemm_nk(x, w, b), F.linear(x, w, b)
            assert not torch.equal(kernel, gemm)  # the two sums round differently, so routing shows
            want = kernel if rows_on_kernel[rows - 1] else gemm
            assert torch.equal(C.small_linear(x, w, b), want), rows
    finally:
        forget()
    assert C.few_rows_choices() == [] and C.few_rows_default() == 8
    for rows, on_kernel in ((8, True), (9, False)):
        x = torch.randn(rows, K)
        assert torch.equal(C.small_linear(x, w, b), C.small_gemm_nk(x, w, b) if on_kernel else F.linear(x, w, b))
    # form 3: the packed conv-step weight against ATen's GEMM on the weight itself, through conv_step
    k, c_in, c2 = 3, 257, 24
    cw, cb = torch.randn(k, c_in, c2, generator=g), torch.randn(c2, generator=g)
    packed = C.pack_kn_weight(cw.view(k * c_in, c2))

    def step_with(choice, x, state):
        C.set_few_rows_choice(3, "float32", k * c_in, c2, choice)
        return C.conv_step_forward(x, state, cw, cb, None, packed)[0]

    try:
        for rows in (1, 3, 4, 9, 64):
            x, state = torch.randn(rows, c_in, generator=g), torch.randn(rows, k - 1, c_in, generator=g)
            kernel, gemm = step_with([True] * 64, x, state), step_with([False] * 64, x, state)
            assert not torch.equal(kernel, gemm), rows  # the two sums round differently, so routing shows
            window = torch.cat([state, x[:, None]], 1).view(rows, -1)
            torch.testing.assert_close(kernel, F.glu(C.small_gemm_kn_packed(window, packed, c2, cb), -1))
            torch.testing.assert_close(gemm, F.glu(torch.addmm(cb, window, cw.view(k * c_in, c2)), -1))
            assert torch.equal(step_with(rows_on_kernel, x, state), kernel if rows_on_kernel[rows - 1] else gemm), rows
    finally:
        forget()
    with pytest.raises(RuntimeError, match="form 3 \\(kp\\) takes float32 or bf16"):
        C.set_few_rows_choice(3, "int8", K, N, [True] * 64)
    with pytest.raises(RuntimeError, match="one entry per row count"):
        C.set_few_rows_choice(0, "float32", K, N, [True] * 3)
    with pytest.raises(RuntimeError, match="float32, bfloat16 or int8"):
        C.set_few_rows_choice(0, "float16", K, N, [True] * 64)
