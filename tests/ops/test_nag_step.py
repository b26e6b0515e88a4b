"""``nag_step``: the cpp kernel and the reference against torch.optim.SGD(nesterov=True) itself
(float64, several steps so the momentum matters, odd sizes, tensors spanning the threads' shares,
a parameter without a gradient, weight decay, the gradient scale), float32 within its rounding,
and the one-line errors."""

import pytest
import torch

import convs2s_kernels as ck
from harness import runnable

SHAPES = [(7,), (3, 5, 11), (300, 257), (1,)]  # 77,100 elements: past one thread's 32,768


def make(dtype, seed=0):
    gen = torch.Generator().manual_seed(seed)
    params = [torch.randn(s, generator=gen, dtype=torch.float64).to(dtype) for s in SHAPES]
    steps = [[torch.randn(s, generator=gen, dtype=torch.float64).to(dtype) for s in SHAPES] for _ in range(4)]
    return params, steps


def torch_sgd(params, steps, lr, momentum, wd, scale, missing):
    ps = [torch.nn.Parameter(p.clone()) for p in params]
    opt = torch.optim.SGD(ps, lr=lr, momentum=momentum, nesterov=True, weight_decay=wd)
    for grads in steps:
        for i, (p, g) in enumerate(zip(ps, grads)):
            p.grad = torch.zeros_like(p) if i == missing else g * scale
        opt.step()
    return [p.detach() for p in ps]


@pytest.mark.parametrize("backend", ["cpp", "reference"])
@pytest.mark.parametrize("wd,scale", [(0.0, 1.0), (1e-3, 0.37)])
def test_equals_torch_sgd_nesterov_float64(backend, wd, scale):
    params, steps = make(torch.float64)
    runnable(backend, "nag_step", params, [None] * len(params), params)
    want = torch_sgd(params, steps, 0.25, 0.99, wd, scale, missing=3)
    got = [p.clone() for p in params]
    bufs = [torch.zeros_like(p) for p in params]
    for k, grads in enumerate(steps):
        lr = 0.25
        ck.nag_step(got, [None if i == 3 else g for i, g in enumerate(grads)], bufs, lr=lr, momentum=0.99,
                    weight_decay=wd, grad_scale=scale, backend=backend)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-12, atol=1e-12)


def test_cpp_float32_within_rounding_of_float64():
    params, steps = make(torch.float64, seed=1)
    runnable("cpp", "nag_step", params, [None] * len(params), params)
    exact = [p.clone() for p in params]
    p32 = [p.float() for p in params]
    b64, b32 = [torch.zeros_like(p) for p in exact], [torch.zeros_like(p) for p in p32]
    for grads in steps:
        ck.nag_step(exact, grads, b64, lr=0.1, momentum=0.9, grad_scale=0.5, backend="reference")
        ck.nag_step(p32, [g.float() for g in grads], b32, lr=0.1, momentum=0.9, grad_scale=0.5, backend="cpp")
    for a, b in zip(p32, exact):
        torch.testing.assert_close(a.double(), b, rtol=1e-5, atol=1e-6)
    for a, b in zip(b32, b64):
        torch.testing.assert_close(a.double(), b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("backend", ["cpp", "reference"])
def test_the_update_moves_the_version_counters_like_an_in_place_op(backend):
    """Caches keyed on a parameter's version (the layers' weight-normed copies) must see the step."""
    p, b = torch.zeros(5, dtype=torch.float64), torch.zeros(5, dtype=torch.float64)
    runnable(backend, "nag_step", [p], [None], [b])
    before = p._version, b._version
    ck.nag_step([p], [torch.ones_like(p)], [b], lr=0.1, momentum=0.9, backend=backend)
    assert p._version > before[0] and b._version > before[1]


def test_auto_takes_cpp_on_the_cpu_and_reference_for_strided_tensors():
    p, g, b = torch.zeros(4, 6), torch.ones(4, 6), torch.zeros(4, 6)
    with ck.count_dispatches() as counts:
        ck.nag_step([p], [g], [b], lr=1.0, momentum=0.5)
        ck.nag_step([p.t()], [g.t()], [b.t()], lr=1.0, momentum=0.5)
    assert counts[("nag_step", "cpp")] == 1 and counts[("nag_step", "reference")] == 1
    # two steps of g = 1: buf 1 then 1.5; p -= 1 + 0.5 * 1, then 1 + 0.5 * 1.5
    torch.testing.assert_close(p, torch.full((4, 6), -3.25))


@pytest.mark.parametrize("backend", ["cpp", "reference"])
def test_bad_lists_are_one_line_errors(backend):
    p = torch.zeros(3)
    with pytest.raises(ValueError, match="1 params, 2 grads"):
        ck.nag_step([p], [None, None], [torch.zeros(3)], lr=1.0, momentum=0.9, backend=backend)
    with pytest.raises(ValueError, match="the momentum buffer of parameter 0 must match"):
        ck.nag_step([p], [None], [torch.zeros(4)], lr=1.0, momentum=0.9, backend=backend)
    with pytest.raises(ValueError, match="the grad of parameter 0 must match"):
        ck.nag_step([p], [torch.zeros(3, dtype=torch.float64)], [torch.zeros(3)], lr=1.0, momentum=0.9,
                    backend=backend)
    with pytest.raises(ValueError, match="momentum buffer of parameter 0 shares memory"):
        ck.nag_step([p], [None], [p], lr=1.0, momentum=0.9, backend=backend)
    g = torch.ones(3)
    with pytest.raises(ValueError, match="momentum buffer of parameter 0 shares memory"):
        ck.nag_step([p], [g], [g.view(3)], lr=1.0, momentum=0.9, backend=backend)
