"""``grad_norm``: the cpp kernel and the reference against the float64 norm written out (odd
sizes, tensors spanning the threads' shares and the kernel's blocks and vector tails, None
entries, an empty list), float32 within its rounding, non-finite values, and the one-line errors."""

import math

import pytest
import torch

import convs2s_kernels as ck
from harness import runnable

SHAPES = [(7,), (3, 5, 11), (300, 257), (1,), (4097,)]  # 77,100 elements: past one thread's 32,768


def make(dtype, seed=0, scale=1.0):
    gen = torch.Generator().manual_seed(seed)
    return [(torch.randn(s, generator=gen, dtype=torch.float64) * scale).to(dtype) for s in SHAPES]


def exact(tensors):
    return math.sqrt(sum(float((t.double() ** 2).sum()) for t in tensors if t is not None))


@pytest.mark.parametrize("backend", ["cpp", "reference"])
def test_equals_the_norm_written_out_float64(backend):
    tensors = make(torch.float64)
    runnable(backend, "grad_norm", tensors)
    got = ck.grad_norm(tensors, backend=backend)
    assert got.dtype == torch.float64 and got.dim() == 0
    assert got.item() == pytest.approx(exact(tensors), rel=1e-13)
    with_none = [None, *tensors[:2], None, *tensors[2:]]
    assert ck.grad_norm(with_none, backend=backend).item() == pytest.approx(exact(tensors), rel=1e-13)


@pytest.mark.parametrize("scale", [1e-6, 1.0, 1e4])  # gradients of any size: the squares' float range
def test_cpp_float32_within_its_rounding_of_float64(scale):
    tensors = make(torch.float32, seed=1, scale=scale)
    runnable("cpp", "grad_norm", tensors)
    got = ck.grad_norm(tensors, backend="cpp").item()
    assert got == pytest.approx(exact(tensors), rel=1e-6)
    ref = ck.grad_norm(tensors, backend="reference").item()
    assert got == pytest.approx(ref, rel=1e-6)


@pytest.mark.parametrize("backend", ["cpp", "reference"])
@pytest.mark.parametrize("bad", [float("inf"), float("nan")])
def test_a_non_finite_element_gives_a_non_finite_norm(backend, bad):
    tensors = make(torch.float32, seed=2)
    tensors[2][123, 45] = bad
    assert not math.isfinite(ck.grad_norm(tensors, backend=backend).item())


def test_strided_tensors_take_the_reference_and_agree():
    tensors = make(torch.float32, seed=3)
    strided = [tensors[2].t(), tensors[0]]
    assert ck.grad_norm(strided).item() == pytest.approx(exact(strided), rel=1e-6)


def test_empty_and_bad_inputs():
    assert ck.grad_norm([]).item() == 0.0
    assert ck.grad_norm([None, None]).item() == 0.0
    with pytest.raises(ValueError, match="grad_norm: tensor 1 is torch.float64 on cpu; all must share"):
        ck.grad_norm([torch.ones(3), torch.ones(2, dtype=torch.float64)])
    with pytest.raises(ValueError, match="grad_norm: tensor 0 is torch.int64"):
        ck.grad_norm([torch.ones(3, dtype=torch.long)])
