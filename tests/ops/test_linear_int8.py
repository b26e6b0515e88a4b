"""``linear_int8`` and ``quantize_int8``: the cpp kernel against the reference (few and many rows,
strided inputs, leading dims), the quantiser's error bound, and the input errors."""

import pytest
import torch

import convs2s_kernels as ck
from convs2s_kernels.testing import assert_close
from harness import runnable


@pytest.mark.parametrize("rows", [1, 2, 5, 8, 13])  # 13: more than the few-row kernel takes
@pytest.mark.parametrize("K,N", [(96, 200), (1536, 64), (33, 7)])
@torch.no_grad()
def test_linear_int8_matches_reference(rows, K, N):
    x, w, b = torch.randn(rows, K), torch.randn(N, K) / K ** 0.5, torch.randn(N)
    q, s = ck.quantize_int8(w)
    runnable("cpp", "linear_int8", x, q, s, b)
    out = ck.linear_int8(x, q, s, b, backend="cpp")
    assert_close("linear_int8", out, ck.linear_int8_ref(x.double(), q, s.double(), b.double()))
    # a strided x (every other column of a wider buffer)
    wide = torch.randn(rows, 2 * K)
    out = ck.linear_int8(wide[:, ::2], q, s, b, backend="cpp")
    assert_close("linear_int8", out, ck.linear_int8_ref(wide[:, ::2].double(), q, s.double(), b.double()))
    # without a bias, and with leading dims
    out = ck.linear_int8(x.view(1, rows, K), q, s, backend="cpp")
    assert out.shape == (1, rows, N)
    assert_close("linear_int8", out[0], ck.linear_int8_ref(x.double(), q, s.double()))


def test_cpp_linear_int8_refuses_other_scale_dtypes():
    x, q, s = torch.randn(2, 8), *ck.quantize_int8(torch.randn(4, 8))
    why = ck.backend_reasons("cpp", "linear_int8", x.device, x, q, s.double())
    assert why and "float32 scale" in why[0]
    assert ck.backend_reasons("cpp", "linear_int8", x.device, x.double(), q, s)


def test_quantize_int8_bounds_the_error_per_row():
    w = torch.randn(50, 70) * torch.logspace(-3, 1, 50).unsqueeze(1)  # rows of very different scales
    w[3] = 0  # a zero row must not divide by zero
    q, s = ck.quantize_int8(w)
    assert q.dtype == torch.int8 and q.is_contiguous() and s.shape == (50,)
    assert int(q.abs().max()) == 127 and torch.all(q[3] == 0)
    err = (q.float() * s.unsqueeze(1) - w).abs()
    assert torch.all(err <= s.unsqueeze(1) / 2 + 1e-12)
    # a transposed (non-contiguous) weight quantises to contiguous rows
    qt, _ = ck.quantize_int8(w.t().contiguous().t())
    assert qt.is_contiguous() and torch.equal(qt, q)


def test_linear_int8_errors_name_the_problem():
    x = torch.randn(2, 8)
    q, s = ck.quantize_int8(torch.randn(4, 8))
    with pytest.raises(TypeError, match="qweight must be int8"):
        ck.linear_int8(x, q.float(), s)
    with pytest.raises(ValueError, match="qweight expects 8 input features but x has 5"):
        ck.linear_int8(torch.randn(2, 5), q, s)
    with pytest.raises(ValueError, match="scale must have shape"):
        ck.linear_int8(x, q, s[:3])
