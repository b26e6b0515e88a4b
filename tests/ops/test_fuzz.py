"""Random-shape fuzzing of every op against its reference, on every backend that runs here.

Seeded (``CONVS2S_FUZZ_SEED``, printed on failure) and bounded in time (``CONVS2S_FUZZ_SECONDS``
per op and backend, and at most ``MAX_CASES`` cases): odd sizes, strided and non-contiguous
inputs (row slices of wider buffers, batch-inner storage), repeated beam parents, padded
sources. Each case compares the backend with the reference computed in float64.
"""

from __future__ import annotations

import copy
import importlib.util
import math
import os
import random
import time

import pytest
import torch

import convs2s_kernels as ck
from convs2s_kernels.testing import assert_close
from convs2s_kernels.ops import TRITON_OPS
from harness import require_or_skip
from test_beam_candidates import assert_candidates
from test_decoder_step import TOLERANCE, make_step

SEED = int(os.environ.get("CONVS2S_FUZZ_SEED", "20261123"))
SECONDS = float(os.environ.get("CONVS2S_FUZZ_SECONDS", "6"))
MAX_CASES = 60
MIN_CASES = 3  # a fuzz run that tried fewer cases than this proves nothing: it fails


def scramble(t: torch.Tensor, rng: random.Random) -> torch.Tensor:
    """The same values in another memory layout: contiguous, a row slice of a wider buffer, or
    stored with the first two dimensions swapped."""
    mode = rng.randrange(3)
    if mode == 1:
        wide = torch.randn(*t.shape[:-1], t.shape[-1] + rng.randint(1, 5), dtype=t.dtype)
        wide[..., : t.shape[-1]] = t
        return wide[..., : t.shape[-1]]
    if mode == 2 and t.dim() >= 2:
        return t.transpose(0, 1).contiguous().transpose(0, 1)
    return t


def conv_glu_case(rng, dtype):
    B, T, c_in, c_out, k = rng.randint(1, 3), rng.randint(1, 19), rng.randint(1, 37), rng.randint(1, 37), rng.randint(1, 5)
    x = torch.randn(B, T, c_in, dtype=dtype)
    w = (torch.randn(k, c_in, 2 * c_out) / math.sqrt(k * c_in)).to(dtype)
    kw = dict(causal=rng.random() < 0.5)
    if rng.random() < 0.5:
        kw.update(residual=scramble(torch.randn(B, T, c_out, dtype=dtype), rng), scale=rng.uniform(0.3, 1.0))
    if rng.random() < 0.5:
        kw["pad_mask"] = torch.arange(T)[None, :] < torch.randint(0, T, (B, 1))
    bias = (0.1 * torch.randn(2 * c_out)).to(dtype) if rng.random() < 0.7 else None
    return (scramble(x, rng), w, bias), kw


def attention_case(rng, dtype):
    B, T, S, E = rng.randint(1, 4), rng.randint(1, 6), rng.randint(1, 23), rng.randint(1, 37)
    q = torch.randn(B, T, E, dtype=dtype) / math.sqrt(E)
    z, y = (scramble(torch.randn(B, S, E, dtype=dtype), rng) for _ in range(2))
    lengths = torch.randint(1, S + 1, (B,)) if rng.random() < 0.7 else None
    return (scramble(q, rng), z, y, lengths), dict(left_pad=rng.random() < 0.7, return_attn=rng.random() < 0.5)


def attention_step_case(rng, dtype):
    B, beam, S, C = rng.randint(1, 4), rng.randint(1, 18), rng.randint(1, 40), rng.randint(1, 80)
    r = lambda *shape, scale=1.0: (torch.randn(*shape) * scale).to(dtype)
    h = scramble(r(B, beam, C), rng)
    args = (h, scramble(r(B, beam, S), rng), r(B, S, scale=0.5), scramble(r(B, S, C, scale=C ** -0.5), rng),
            scramble(r(B, S, C), rng), r(C, scale=0.1), torch.randint(1, S + 1, (B,)),
            scramble(r(B, beam, C), rng) if rng.random() < 0.7 else None)
    return args, dict(left_pad=rng.random() < 0.7, need_attn=rng.random() < 0.5)


def conv_step_case(rng, dtype):
    n_prev, n, c_in, c_out, k = rng.randint(1, 8), rng.randint(1, 11), rng.randint(1, 70), rng.randint(1, 70), rng.randint(1, 5)
    x_t = scramble(torch.randn(n, c_in, dtype=dtype), rng)
    state = scramble(torch.randn(n_prev, k - 1, c_in, dtype=dtype), rng)
    w = (torch.randn(k, c_in, 2 * c_out) / math.sqrt(k * c_in)).to(dtype)
    parents = torch.randint(0, n_prev, (n,))
    parents[-1] = parents[0]  # a repeated parent
    return (x_t, state, w, (0.1 * torch.randn(2 * c_out)).to(dtype), parents), {}


def linear_case(rng, dtype):
    rows, K, N = rng.randint(1, 12), rng.randint(1, 300), rng.randint(1, 300)
    w = (torch.randn(N, K) / math.sqrt(K)).to(dtype)
    return (scramble(torch.randn(rows, K, dtype=dtype), rng), w, torch.randn(N, dtype=dtype)), {}


def linear_int8_case(rng, dtype):
    (x, w, b), _ = linear_case(rng, dtype)
    q, s = ck.quantize_int8(w)
    return (x, q, s.to(dtype), b), {}


def linear_w8a8_case(rng, dtype):
    rows, K, N = rng.randint(1, 80), rng.randint(1, 700), rng.randint(1, 300)
    q, s = ck.quantize_int8(torch.randn(N, K) / math.sqrt(K))
    bias = torch.randn(N) if rng.random() < 0.7 else None
    return (scramble(torch.randn(rows, K) * rng.choice([1e-3, 1.0, 50.0]), rng), q, s, bias), {}


def decoder_step_case(rng, dtype):
    B, beam, S = rng.randint(1, 3), rng.randint(1, 4), rng.randint(1, 9)
    x, states, layers, emb, pad, lengths = make_step(B, beam, S, int8=dtype == torch.float32 and rng.random() < 0.3,
                                                     dtype=dtype)
    parents = torch.randint(0, B * beam, (B * beam,))
    x, states = scramble(x, rng), [scramble(s, rng) for s in states]
    return (x, states, layers, emb, pad, lengths, parents), dict(need_attn=rng.random() < 0.5)


def beam_candidates_case(rng, dtype):
    B, beam, V = rng.randint(1, 4), rng.randint(1, 6), rng.randint(8, 3000)
    N, step = B * beam, rng.randint(0, 12)
    logits = scramble(torch.randn(N, V, dtype=dtype) * 3, rng)
    kwargs = dict(beam=beam, step=step, max_len=rng.randint(step, step + 3), min_len=rng.randint(0, 10),
                  unkpen=rng.choice([0.0, 0.5]), ignore=torch.rand(B, beam) < 0.3)
    if rng.random() < 0.5:
        kwargs["forced_len"] = torch.randint(step - 1 if step else 0, step + 2, (N,))
    return (logits, -20 * torch.rand(N)), kwargs


def beam_update_case(rng, dtype):
    """A random search step's candidates and buffers: sentences done or part-finished, ignored
    beams, EOS from rare to common among the candidates, sometimes the last step, sometimes the
    attention carried along."""
    k, B = rng.randint(1, 5), rng.randint(1, 4)
    B0, max_len, V, N = B + rng.randint(0, 3), rng.randint(1, 12), rng.randint(5, 40), B * k
    step, src_len = rng.randint(0, max_len), rng.choice([0, rng.randint(1, 6)])
    logits = torch.randn(N, V, dtype=dtype)
    logits[:, 2] += rng.uniform(0.0, 4.0)  # EOS (2)
    ignore = torch.rand(B, k) < rng.random() * 0.5
    cands = ck.beam_candidates_ref(logits, -10 * torch.rand(N, dtype=dtype), beam=k, step=step, max_len=max_len,
                                   ignore=ignore)
    tokens = torch.randint(4, V, (N, max_len + 2 + rng.choice([0, 3])))[:, : max_len + 2]  # maybe a wider buffer's
    scores = -torch.rand(N, max_len + 1, dtype=dtype).cumsum(1)
    finished = ck.FinishedHypotheses.empty(B0, k, max_len, src_len)
    finished.count.copy_(torch.randint(0, k + 1, (B0,)))
    finished.done.copy_(finished.count == k)
    kwargs = dict(lenpen=rng.choice([1.0, 0.6, 1.3]), at_max_len=step == max_len,
                  attn=torch.rand(N, src_len, max_len + 2, dtype=dtype) if src_len else None)
    return (cands, step, tokens, scores, ignore, torch.randperm(B0)[:B], finished), kwargs


def first_tensor(args) -> torch.Tensor:
    return next(a for a in args if isinstance(a, torch.Tensor))


CASES = {"conv_glu": conv_glu_case, "attention_embsum": attention_case, "attention_step": attention_step_case,
         "conv_step": conv_step_case,
         "linear": linear_case, "linear_int8": linear_int8_case, "linear_w8a8": linear_w8a8_case,
         "decoder_step": decoder_step_case,
         "beam_candidates": beam_candidates_case, "beam_update": beam_update_case}
REFERENCES = {"conv_glu": ck.conv_glu_ref, "attention_embsum": ck.attention_embsum_ref,
              "attention_step": ck.attention_step_ref, "conv_step": ck.conv_step_ref,
              "linear": ck.linear_ref, "linear_int8": ck.linear_int8_ref, "linear_w8a8": ck.linear_w8a8_ref,
              "decoder_step": ck.decoder_step_ref,
              "beam_candidates": ck.beam_candidates_ref, "beam_update": ck.beam_update_ref}


def as_double(value):
    return value.double() if isinstance(value, torch.Tensor) and value.is_floating_point() else value


def whole_storage(t: torch.Tensor) -> torch.Tensor:
    """Every element of ``t``'s storage, the ones its view leaves out too (deepcopy copies them all)."""
    return torch.empty(0, dtype=t.dtype).set_(t.untyped_storage())


def check_beam_update(backend, args, kwargs):
    """In place on the search's buffers: the backend on the case's, the reference on a copy; the
    same parents, next ignore and buffers, bit for bit (the finished slots' scratch rows aside)."""
    ref_args, ref_kwargs = copy.deepcopy((args, kwargs))
    want = ck.beam_update_ref(*ref_args, **ref_kwargs)
    got = ck.beam_update(*args, **kwargs, backend=backend)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]), "parents or next ignore"
    for name, g, w in (("tokens", args[2], ref_args[2]), ("scores", args[3], ref_args[3]),
                       ("attn", kwargs["attn"], ref_kwargs["attn"])):
        # the whole storage: a view of a wider buffer must not be written past its columns
        assert (g is None and w is None) or torch.equal(whole_storage(g), whole_storage(w)), name
    finished, ref_finished = args[6], ref_args[6]
    slots = finished.count.numel() * args[4].shape[1]
    for name, g, w in zip(finished._fields, finished, ref_finished):
        if g is not None:
            assert torch.equal(g[:slots] if g.shape[0] == 2 * slots else g,
                               w[:slots] if w.shape[0] == 2 * slots else w), f"finished.{name}"


def check_case(op, backend, args, kwargs, dtype):
    if op == "beam_update":
        check_beam_update(backend, args, kwargs)
        return
    got = getattr(ck, op)(*args, **kwargs, backend=backend)
    if op == "decoder_step":  # (x, attention or None, new states): every output
        want = ck.decoder_step_ref(*args, **kwargs)
        torch.testing.assert_close(got[0], want[0], **TOLERANCE[dtype])
        assert (got[1] is None) == (want[1] is None), "attention returned iff asked for"
        if want[1] is not None:
            torch.testing.assert_close(got[1], want[1], **TOLERANCE[dtype])
        assert len(got[2]) == len(want[2])
        for new, ref in zip(got[2], want[2]):
            torch.testing.assert_close(new, ref, **TOLERANCE[dtype])
        return
    if op == "beam_candidates":  # a search step: cpp the same choices bit for bit, Triton a best choice
        assert_candidates(backend, got, ck.beam_candidates_ref(*args, **kwargs), *args, **kwargs)
        return
    want = REFERENCES[op](*(as_double(a) for a in args), **kwargs)
    got, want = (got if isinstance(got, tuple) else (got,)), (want if isinstance(want, tuple) else (want,))
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert (g is None) == (w is None), "an output returned iff the reference returns it"
        if w is not None:
            assert_close(op, g, w)


# every op with a cpp kernel on cpp; Triton's ops on Triton (on GPUs the others are cuBLAS GEMMs)
PAIRS = [("cpp", op) for op in CASES if importlib.util.find_spec(f"convs2s_kernels.ops.{op}.cpp")] + \
    [("triton", op) for op in TRITON_OPS]


@pytest.mark.parametrize("backend,op", PAIRS)
@torch.no_grad()
def test_fuzz_against_reference(op, backend):
    require_or_skip(backend)
    rng = random.Random(f"{SEED}-{op}-{backend}")
    torch.manual_seed(rng.randrange(2 ** 31))
    tried, ran, deadline = 0, 0, time.monotonic() + SECONDS
    while tried < MAX_CASES and (time.monotonic() < deadline or tried < MIN_CASES):
        dtype = rng.choice([torch.float32, torch.float64] if op not in ("linear", "linear_w8a8", "decoder_step", "beam_candidates",
                                                                        "beam_update")
                           else [torch.float32])
        args, kwargs = CASES[op](rng, dtype)
        tried += 1
        if ck.backend_reasons(backend, op, first_tensor(args).device, *args, **kwargs):
            continue  # outside what this backend takes (e.g. more rows than a few-row kernel)
        try:
            check_case(op, backend, args, kwargs, dtype)
        except AssertionError as exc:
            raise AssertionError(f"{op} on {backend}, case {tried} (CONVS2S_FUZZ_SEED={SEED}, {dtype}, "
                                 f"shapes {[tuple(a.shape) for a in args if isinstance(a, torch.Tensor)]}): {exc}")
        ran += 1
    assert ran >= MIN_CASES, f"only {ran} of {tried} fuzz cases of {op} ran on {backend}"


def test_fuzz_conv_glu_winograd_gradients(monkeypatch):
    """The cpp convolution's training path (Winograd F(2, 3) and F(4, 3), every row count) on random
    width-3 cases: the output and the gradients of every input against the float64 reference."""
    from convs2s_kernels.ops.conv_glu import cpp as conv_cpp

    from harness import assert_grads_close

    require_or_skip("cpp")
    monkeypatch.setattr(conv_cpp, "WINOGRAD_MIN_ROWS", 0)
    rng = random.Random(f"{SEED}-conv_glu-winograd")
    torch.manual_seed(rng.randrange(2 ** 31))
    ran, deadline = 0, time.monotonic() + SECONDS
    while ran < MAX_CASES and (time.monotonic() < deadline or ran < MIN_CASES):
        dtype, tile = rng.choice([torch.float32, torch.float64]), rng.choice([2, 4])
        monkeypatch.setenv("CONVS2S_CONV_WINOGRAD", str(tile))
        (x, w, bias), kw = conv_glu_case(rng, dtype)
        w = (torch.randn(3, w.shape[1], w.shape[2]) / math.sqrt(3 * w.shape[1])).to(dtype)
        leaves = [t.detach().clone().requires_grad_() for t in (x, w) + ((bias,) if bias is not None else ())]
        res = kw.get("residual")
        if res is not None:
            kw["residual"] = res = res.detach().clone().requires_grad_()
        got = ck.conv_glu(leaves[0], leaves[1], leaves[2] if bias is not None else None, backend="cpp", **kw)
        dout = torch.randn_like(got)
        inputs = leaves + ([res] if res is not None else [])
        grads = torch.autograd.grad(got, inputs, dout)
        ref = [t.detach().double().requires_grad_() for t in inputs]
        ref_kw = dict(kw, residual=ref[-1]) if res is not None else kw
        want = ck.conv_glu_ref(ref[0], ref[1], ref[2] if bias is not None else None, **ref_kw)
        case = (f"case {ran + 1} (CONVS2S_FUZZ_SEED={SEED}, {dtype}, F({tile},3), x {tuple(x.shape)}, "
                f"{ {k: v for k, v in kw.items() if not isinstance(v, torch.Tensor)} })")
        try:
            assert_close("conv_glu", got, want)
            assert_grads_close(grads, torch.autograd.grad(want, ref, dout.double()),
                               ["x", "weight", "bias" if bias is not None else "residual", "residual"], dtype)
        except AssertionError as exc:
            raise AssertionError(f"conv_glu Winograd on cpp, {case}: {exc}")
        ran += 1
    assert ran >= MIN_CASES


@pytest.mark.parametrize("cap", ["avx2", "baseline"])
def test_fuzz_conv_glu_winograd_gradients_at_lower_instruction_sets(cap):
    """The Winograd transforms' and the GLU derivative's other compiled copies (CONVS2S_KERNELS_ISA)."""
    import os
    import subprocess
    import sys

    require_or_skip("cpp")
    here = os.path.dirname(os.path.abspath(__file__))
    # a third of the fuzz time: the copies differ from the tested one only in their vector width
    env = dict(os.environ, CONVS2S_KERNELS_ISA=cap, CONVS2S_FUZZ_SECONDS=str(SECONDS / 3))
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
                          os.path.join(here, "test_fuzz.py"), "-k", "test_fuzz_conv_glu_winograd_gradients and not lower"],
                         capture_output=True, text=True, env=env, timeout=600, cwd=here)
    assert out.returncode == 0 and " passed" in out.stdout, out.stdout[-2000:] + out.stderr[-1000:]
