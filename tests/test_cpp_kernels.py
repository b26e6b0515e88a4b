"""C++-only entry points that have no public op of their own (skipped when the extension is missing)."""

import pytest
import torch

import convs2s_kernels as ck

pytestmark = pytest.mark.skipif(ck.available_backends()["cpp"] is not None,
                                reason=f"cpp backend unavailable: {ck.available_backends()['cpp']}")


@pytest.mark.parametrize("rows", range(1, 9))
@pytest.mark.parametrize("K,N", [(300, 77), (16, 16), (1, 5), (513, 1030)])
def test_small_linear_matches_f_linear(rows, K, N):
    from convs2s_kernels import _C

    g = torch.Generator().manual_seed(rows * 1000 + K)
    x = torch.randn(rows, K, generator=g)
    w = torch.randn(N, K, generator=g) / K ** 0.5
    b = torch.randn(N, generator=g)
    torch.testing.assert_close(_C.small_linear(x, w, b), torch.nn.functional.linear(x, w, b), atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(_C.small_linear(x, w), torch.nn.functional.linear(x, w), atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("rows", [2, 5, 8])
def test_small_linear_bf16_matches_a_bf16_linear(rows):
    from convs2s_kernels import _C

    g = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, 200, generator=g).bfloat16()
    w = (torch.randn(70, 200, generator=g) / 14).bfloat16()
    b = torch.randn(70, generator=g).bfloat16()
    out = _C.small_linear(x, w, b)
    assert out.dtype == torch.bfloat16
    want = torch.nn.functional.linear(x.double(), w.double(), b.double())
    torch.testing.assert_close(out.double(), want, atol=3e-2, rtol=2e-2)


def test_small_linear_rejects_what_it_cannot_do():
    from convs2s_kernels import _C

    with pytest.raises(RuntimeError, match="1..8 rows"):
        _C.small_linear(torch.randn(9, 4), torch.randn(3, 4))
    with pytest.raises(RuntimeError, match="float32 or bf16"):
        _C.small_linear(torch.randn(2, 4).double(), torch.randn(3, 4).double())
    assert _C.small_gemm_isa() in ("avx512f", "avx2+fma", "baseline")
