"""The machine's limits the benchmarks divide by (``bench/convs2s_bench/roofline.py``): the fp32
compute peak is the better of ATen's GEMM and the FMA units' register-only rate (MKL runs its
AVX2 code on AMD CPUs, so its GEMM alone was below what the AVX-512 kernels reached), and the
FMA rate follows the kernels' instruction-set cap."""

import os
import subprocess
import sys

import pytest
import torch

from convs2s_bench import roofline
from harness import require_or_skip


@pytest.fixture(autouse=True)
def cpp():
    require_or_skip("cpp")


def test_the_fp32_peak_is_no_lower_than_the_library_gemm_or_the_fma_units(monkeypatch):
    monkeypatch.setattr(roofline, "fma_peak_gflops", lambda repeats=3: 1e9)
    assert roofline.gemm_peak_gflops(n=64, repeats=1) == 1e9  # the FMA rate above the GEMM wins
    monkeypatch.setattr(roofline, "fma_peak_gflops", lambda repeats=3: 1e-9)
    gemm = roofline.gemm_peak_gflops(n=64, repeats=1)
    assert 1e-9 < gemm < 1e6  # the GEMM above the FMA rate wins


@pytest.mark.parametrize("native", [True, False])
def test_the_bf16_peak_is_its_gemm_where_native_else_widening_to_fp32(monkeypatch, native):
    # without native bf16 dot products ATen's bf16 GEMM is far below fp32 (0.3 GFLOP/s on a Zen 3)
    # and the kernels widen bf16 to fp32: a bf16 decode must not read as above its limit
    monkeypatch.setattr(roofline, "_native_bf16", lambda: native)
    monkeypatch.setattr(roofline, "fma_peak_gflops", lambda repeats=3: 1e9)
    peak = roofline.gemm_peak_gflops(dtype=torch.bfloat16, n=64, repeats=1)
    assert (peak < 1e9) if native else (peak == 1e9)


def test_the_fma_peak_is_positive_and_follows_the_isa_cap():
    peak = roofline.fma_peak_gflops(repeats=1)
    assert peak is not None and peak > 0
    code = ("import torch; from convs2s_bench import roofline; torch.set_num_threads(1); "
            "print(roofline.fma_peak_gflops(repeats=2))")
    rates = {}
    for cap in ("avx2", "baseline"):
        env = dict(os.environ, CONVS2S_KERNELS_ISA=cap)
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
        assert out.returncode == 0, out.stderr[-2000:]
        rates[cap] = float(out.stdout.strip())
    # 8 float lanes with FMA against 4 lanes with a multiply and an add: at least twice the rate
    assert rates["avx2"] > 1.5 * rates["baseline"] > 0


def test_the_copy_bandwidth_is_measured_on_huge_pages(monkeypatch):
    placed = []
    from convs2s_kernels import huge_pages

    real = huge_pages.on_huge_pages
    monkeypatch.setattr(huge_pages, "on_huge_pages", lambda t: placed.append(t.numel()) or real(t))
    assert roofline.copy_peak_gbps(megabytes=4, repeats=1) > 0
    assert placed == [1 << 20, 1 << 20]  # source and destination


def test_the_int8_peak_is_no_lower_than_the_project_int8_kernel_or_its_instructions(monkeypatch):
    # without VNNI torch._int_mm ran at 2 GOP/s on a Zen 3 while the step's int8 kernel ran near
    # 100: the step profile's int8 bound must not come from the library alone, nor from the kernel
    # alone (it ran at ~75% of its instructions' rate there)
    assert roofline.int8_kernel_peak_gops(n=64, rows=8, repeats=1) > 0
    monkeypatch.setattr(roofline, "int8_kernel_peak_gops", lambda n, repeats, activation_bits, weight_bits: 1e9)
    assert roofline.int8_gemm_peak_gops(n=64, repeats=1) == 1e9
    # 7-bit activations (and weights): the kernel and the instructions with those widths set the peak
    bits = []
    monkeypatch.setattr(roofline, "int8_kernel_peak_gops",
                        lambda n, repeats, activation_bits, weight_bits: bits.append((activation_bits, weight_bits)))
    monkeypatch.setattr(roofline, "int8_dot_peak_gops",
                        lambda activation_bits, weight_bits, **_: bits.append((activation_bits, weight_bits)))
    roofline.int8_gemm_peak_gops(n=64, repeats=1, activation_bits=7)
    roofline.int8_gemm_peak_gops(n=64, repeats=1, activation_bits=7, weight_bits=7)
    assert bits == [(7, 8), (7, 8), (7, 7), (7, 7)]
    monkeypatch.setattr(roofline, "int8_kernel_peak_gops", lambda n, repeats, activation_bits, weight_bits: None)
    monkeypatch.setattr(roofline, "int8_dot_peak_gops", lambda **_: 1e9)
    assert roofline.int8_gemm_peak_gops(n=64, repeats=1) == 1e9
    monkeypatch.setattr(roofline, "int8_dot_peak_gops", lambda **_: None)
    assert 0 < roofline.int8_gemm_peak_gops(n=64, repeats=1) < 1e9


def test_the_int8_kernel_runs_below_its_instructions_register_rate():
    """The int8 dot products' register-only rate bounds the int8 kernel that multiplies with the
    same instructions (a fraction of peak above 1 would be a miscount), and follows the ISA cap:
    none on the baseline, whose kernel has no SIMD dot product."""
    # the dot rate before and after the kernel, the better of the two: on a VM whose vCPUs slow down
    # for seconds at a time, one short sample may land in a slow spell that the kernel missed
    code = ("import torch; from convs2s_bench import roofline; from convs2s_kernels.extension import native\n"
            "torch.set_num_threads(1)\n"
            "for bits, wbits in ((8, 8), (7, 8), (7, 7)):\n"
            "    before = roofline.int8_dot_peak_gops(repeats=3, activation_bits=bits, weight_bits=wbits)\n"
            "    kernel = roofline.int8_kernel_peak_gops(n=1024, rows=64, repeats=3, activation_bits=bits, weight_bits=wbits)\n"
            "    after = roofline.int8_dot_peak_gops(repeats=3, activation_bits=bits, weight_bits=wbits)\n"
            "    print(native().linear_w8a8_isa(), None if before is None else max(before, after), kernel,"
            " roofline.fma_peak_gflops(repeats=2))")
    for cap in ("avx2", "baseline"):
        # oneDNN capped too: on a VNNI CPU the library's exact int8 GEMM would otherwise take the
        # 64-row product, faster than any AVX2 instruction rate
        env = dict(os.environ, CONVS2S_KERNELS_ISA=cap, ONEDNN_MAX_CPU_ISA="AVX2")
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
        assert out.returncode == 0, out.stderr[-2000:]
        # 7: the kernel's 7-bit path and its rate; (7, 7): its paired groups for 7-bit weights
        for bits, line in zip(((8, 8), (7, 8), (7, 7)), out.stdout.splitlines()):
            isa, dot, kernel, fma = line.split()
            if cap == "baseline":
                assert isa == "baseline" and dot == "None"
            else:
                assert isa == "avx2", "capped at AVX2, the int8 kernels run their AVX2 code"
                assert 0 < float(kernel) < 1.15 * float(dot), (bits, kernel, dot)
                # 32 multiply-adds per 2 multiplies (64 per 3 paired) against 8 per FMA: at most 4x
                # (6x) the FMA units' rate
                assert float(dot) < (6 if bits == (7, 7) else 4) * float(fma), (bits, dot, fma)
