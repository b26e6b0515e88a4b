"""``dropout``: the cpp kernel against the reference's int64 hash (the same bits: equal outputs in
every dtype, odd sizes, strided inputs), the gradient (the same mask, remade from the seed), the
kept fraction, the seed's role (``torch.manual_seed`` repeats the masks) and the identity cases."""

import pytest
import torch

import convs2s_kernels as ck
from convs2s_kernels.ops.dropout.reference import keep_mask
from harness import runnable


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("shape", [(1,), (3, 5, 7), (37, 129)])
@pytest.mark.parametrize("p", [0.1, 0.5])
def test_cpp_equals_reference_forward_and_backward(shape, dtype, p):
    x = torch.randn(*shape, dtype=torch.float64).to(dtype)
    runnable("cpp", "dropout", x)
    seed = 2 ** 40 + 12345  # both halves of the seed matter
    outs = []
    for backend in ("cpp", "reference"):
        leaf = x.clone().requires_grad_()
        y = ck.dropout(leaf, p, seed=seed, backend=backend)
        (grad,) = torch.autograd.grad(y, leaf, torch.ones_like(y) * 3)
        outs.append((y.detach(), grad))
    torch.testing.assert_close(outs[0][0], outs[1][0], rtol=0, atol=0)
    torch.testing.assert_close(outs[0][1], outs[1][1], rtol=0, atol=0)
    keep = keep_mask(x.numel(), p, seed).view(shape)
    torch.testing.assert_close(outs[1][1], (keep.to(dtype) * 3 / (1 - p)).to(dtype), rtol=1e-2 if dtype == torch.bfloat16
                               else 1e-12, atol=0)


def test_cpp_bfloat16_vectors_round_as_the_reference():
    """bf16 (autocast's activations) on the vectorised path, over two threads' shares and ragged
    tails: magnitudes from subnormal to near overflow round to nearest even as the reference's
    bf16 arithmetic does, bit for bit; a kept NaN stays NaN, a kept infinity infinite."""
    g = torch.Generator().manual_seed(3)
    n = 70001
    x = (torch.randn(n, generator=g, dtype=torch.float64) * torch.logspace(-40, 37, n, dtype=torch.float64)
         ).to(torch.bfloat16)
    runnable("cpp", "dropout", x)
    p, seed = 0.3, 99
    keep = keep_mask(n, p, seed)
    kept = keep.nonzero().flatten()
    x[kept[5]], x[kept[6]] = float("nan"), float("-inf")
    got = ck.dropout(x, p, seed=seed, backend="cpp")
    want = ck.dropout(x, p, seed=seed, backend="reference")
    finite_kept = keep & torch.isfinite(x)
    assert torch.equal(got[finite_kept].view(torch.int16), want[finite_kept].view(torch.int16)), "bit for bit"
    assert torch.isnan(got[kept[5]]) and got[kept[6]] == float("-inf")
    assert torch.all(got[~keep] == 0)


def test_strided_input_is_masked_in_its_logical_order():
    base = torch.randn(40, 30)
    x = base.t()  # not contiguous
    got = ck.dropout(x, 0.3, seed=7, backend="cpp")
    want = ck.dropout(x.contiguous(), 0.3, seed=7, backend="reference")
    torch.testing.assert_close(got, want, rtol=0, atol=0)


@pytest.mark.parametrize("p", [0.2, 0.7])
def test_kept_fraction_and_independence_of_seeds(p):
    n = 1 << 20
    a = keep_mask(n, p, 1)
    b = keep_mask(n, p, 2)
    assert abs(float(a.float().mean()) - (1 - p)) < 3e-3
    both = float((a & b).float().mean())  # independent masks: (1 - p)^2 kept by both
    assert abs(both - (1 - p) ** 2) < 3e-3
    # neighbours are not correlated either
    assert abs(float((a[1:] & a[:-1]).float().mean()) - (1 - p) ** 2) < 3e-3


def test_the_seed_comes_from_torchs_generator():
    x = torch.randn(64, 64)
    torch.manual_seed(5)
    first = ck.dropout(x, 0.2, backend="cpp")
    second = ck.dropout(x, 0.2, backend="cpp")
    torch.manual_seed(5)
    again = ck.dropout(x, 0.2, backend="cpp")
    assert torch.equal(first, again) and not torch.equal(first, second)


def test_identity_cases_and_bad_p():
    x = torch.randn(5, 5)
    assert ck.dropout(x, 0.5, training=False) is x
    assert ck.dropout(x, 0.0) is x
    with pytest.raises(ValueError, match=r"dropout probability must lie in \[0, 1\), got 1.0"):
        ck.dropout(x, 1.0)


_ISA_CODE = """
import sys
import torch
import convs2s_kernels as ck
sys.path.insert(0, sys.argv[1])
import test_dropout as t
for n in (1, 7, 4099, 70001):  # tails of every vector width; several threads' shares
    for dtype in (torch.float32, torch.bfloat16):
        x = torch.randn(n).to(dtype)
        for p in (0.1, 0.5):
            got = ck.dropout(x, p, seed=2 ** 40 + n, backend="cpp")
            want = ck.dropout(x, p, seed=2 ** 40 + n, backend="reference")
            assert torch.equal(got, want), (n, dtype, p)
t.test_cpp_bfloat16_vectors_round_as_the_reference()
"""


@pytest.mark.parametrize("cap", ["avx2", "baseline"])
def test_cpp_masks_at_lower_instruction_sets(cap):
    """The float32 and bf16 loops' other compiled copies (CONVS2S_KERNELS_ISA) give the reference's bits too."""
    from harness import assert_runs_at_isa
    assert_runs_at_isa(_ISA_CODE, cap)
