"""``beam_candidates``: the cpp and Triton steps against the reference (fairseq's step op by op)
-- every rule (NaN, PAD, UNK penalty, min/max length, forced lengths, ignored EOS), step 0, odd
vocabularies, strided inputs, bf16 logits, repeated beams (real ties), a step on the device, rows
in several lane chunks -- and the input errors.

cpp computes ATen's log-softmax, so its scores are the reference's bit for bit; Triton sums the
exponentials in its own order (online, per lane), so its scores are checked against the exact
(float64) step within a tolerance, and its choice as a best ``C`` under those scores."""

import importlib

import pytest
import torch

import convs2s_kernels as ck
from convs2s_kernels.ops.beam_candidates.reference import search_rules_ref
from harness import runnable

PAD, EOS, UNK = 1, 2, 3


def assert_same_candidates(got: ck.BeamCandidates, want: ck.BeamCandidates) -> None:
    """Equal scores (bit for bit, in order), masks, and the same (beam, token) for every score;
    among equal scores (ties, -inf fillers) the order is free, so those compare as sets, and a tie
    at a row's last score may continue past it (which of the tied entries make the cut is free)."""
    assert torch.equal(got.scores, want.scores), (got.scores, want.scores)
    assert torch.equal(got.eos_mask, want.eos_mask)
    for b in range(got.scores.shape[0]):
        last = want.scores[b, -1]
        for score in want.scores[b].unique():
            at = want.scores[b] == score
            pairs = lambda c: sorted(zip(c.beams[b][at].tolist(), c.tokens[b][at].tolist()))  # noqa: E731
            if score.isfinite() and score != last:
                assert pairs(got) == pairs(want), f"sentence {b}, score {score}"
            else:  # -inf fillers or the cut through a tie: as many entries
                assert len(pairs(got)) == len(pairs(want))


SCORE_TOL = 1e-5  # Triton's scores against the exact step's: relative, floored at 1 (fp32 sums of V exps)


def exact_table(logits, prev, *, beam, step, max_len, min_len=1, unkpen=0.0, forced_len=None, pad=PAD, eos=EOS,
                unk=UNK, **unused):
    """Every continuation's score in float64 under the search's rules: ``(B, live beams, V)``."""
    N, V = logits.shape
    lp = torch.log_softmax(logits.double(), dim=-1)
    search_rules_ref(lp, step, max_len, min_len, unkpen, forced_len=forced_len, pad=pad, eos=eos, unk=unk)
    lp = lp.view(N // beam, beam, V)
    if isinstance(step, int) and step == 0:
        return lp[:, :1]
    return lp + prev.double().view(N // beam, beam, 1)


def assert_a_best_choice(got: ck.BeamCandidates, want: ck.BeamCandidates, logits, prev, **kwargs) -> None:
    """``got`` is a best ``C`` of the exact step up to ``SCORE_TOL``: distinct continuations, each
    scored within the tolerance of its exact score, sorted, the j-th as good as the exact j-th;
    its EOS mask follows its tokens; its scores are the fp32 reference's within the tolerance."""
    table = exact_table(logits, prev, **kwargs)
    B, live, V = table.shape
    C = want.scores.shape[1]
    assert got.scores.shape == (B, C) and got.scores.dtype == torch.float32
    assert got.tokens.dtype == got.beams.dtype == torch.int64 and got.eos_mask.dtype == torch.bool
    torch.testing.assert_close(got.scores, want.scores, rtol=SCORE_TOL, atol=SCORE_TOL)
    best = table.reshape(B, -1).topk(C, dim=1).values
    ignore = kwargs.get("ignore")
    for b in range(B):
        pairs = list(zip(got.beams[b].tolist(), got.tokens[b].tolist()))
        assert len(set(pairs)) == C and all(0 <= r < live and 0 <= t < V for r, t in pairs), pairs
        exact = torch.stack([table[b, r, t] for r, t in pairs])
        tol = SCORE_TOL * exact.abs().clamp_min(1.0)
        finite = exact.isfinite()
        assert torch.equal(finite, got.scores[b].isfinite()), f"sentence {b}: -inf where the exact score is not"
        assert torch.all((got.scores[b].double() - exact).abs()[finite] <= tol[finite]), f"sentence {b}: scores"
        assert torch.all(got.scores[b][1:] <= got.scores[b][:-1]), f"sentence {b}: not best first"
        assert torch.all((exact - best[b]).abs()[finite] <= 2 * tol[finite]) and torch.equal(
            finite, best[b].isfinite()), f"sentence {b}: not a best {C}"
        ends = got.tokens[b].eq(kwargs.get("eos", EOS)) & finite
        if ignore is not None:
            ends[: ignore.shape[1]] &= ~ignore[b]
        assert torch.equal(got.eos_mask[b], ends), f"sentence {b}: eos_mask"


def assert_candidates(backend, got, want, logits, prev, **kwargs) -> None:
    """cpp: the reference's choice bit for bit (ties free); Triton: a best choice within tolerance."""
    if backend == "cpp":
        assert_same_candidates(got, want)
    else:
        assert_a_best_choice(got, want, logits, prev, **kwargs)


def search_inputs(B, beam, V, seed=0):
    g = torch.Generator().manual_seed(seed)
    N = B * beam
    logits = torch.randn(N, V, generator=g) * 4
    prev = -torch.rand(N, generator=g) * 20
    forced = torch.randint(2, 9, (N,), generator=g)
    ignore = torch.rand(B, beam, generator=g) < 0.4
    return logits, prev, forced, ignore


RULES = {
    "plain": dict(),
    "min_len_unkpen": dict(min_len=6, unkpen=0.75),
    "forced": "forced",
    "forced_ignore_unkpen": "forced+ignore",
}


# (B, beam, V): one row, Table 3's beam, a 40k vocabulary (cpp only: slow in Triton's interpreter,
# which the GPU test below covers), small and tiny vocabularies (fewer tokens than candidates)
SHAPES = [(1, 1, 37), (3, 5, 1003), (2, 4, 40000), (4, 2, 17), (2, 3, 5)]
SHAPE_CASES = [pytest.param(backend, *shape, id=f"{backend}-B{shape[0]}_beam{shape[1]}_V{shape[2]}")
               for backend in ("cpp", "triton") for shape in SHAPES if backend == "cpp" or shape[2] < 10000]


@pytest.mark.parametrize("backend,B,beam,V", SHAPE_CASES)
@pytest.mark.parametrize("step", [0, 1, 4, 7, 8, 12])
@pytest.mark.parametrize("rules", list(RULES))
@torch.no_grad()
def test_matches_reference(backend, B, beam, V, step, rules):
    logits, prev, forced, ignore = search_inputs(B, beam, V, seed=step)
    logits[0, V // 2] = float("nan")  # a NaN score is -inf
    logits[-1, -1] = float("-inf")
    kwargs = dict(beam=beam, step=step, max_len=8, pad=PAD, eos=EOS, unk=UNK)
    spec = RULES[rules]
    if spec == "forced":
        kwargs.update(forced_len=forced)
    elif spec == "forced+ignore":
        kwargs.update(forced_len=forced, ignore=ignore, unkpen=1.5)
    else:
        kwargs.update(spec)
    runnable(backend, "beam_candidates", logits, prev, **kwargs)
    got = ck.beam_candidates(logits, prev, backend=backend, **kwargs)
    want = ck.beam_candidates_ref(logits, prev, **kwargs)
    C = min(2 * beam, (1 if step == 0 else beam) * V - 1)
    assert got.scores.shape == (B, C) and got.tokens.dtype == torch.int64 and got.eos_mask.dtype == torch.bool
    assert_candidates(backend, got, want, logits, prev, **kwargs)


@pytest.mark.parametrize("backend", ["cpp", "triton"])
@torch.no_grad()
def test_repeated_beams_tie_and_strided_inputs(backend):
    """Beams that repeat a parent (identical rows and scores) tie exactly; logits as a column
    slice of a wider buffer and running scores as a column of the search's score table."""
    B, beam, V = 3, 4, 2001
    rows = torch.randn(B, 1, V).expand(B, beam, V).reshape(B * beam, V)
    wide = torch.randn(B * beam, V + 7)
    wide[:, 3 : V + 3] = rows
    logits = wide[:, 3 : V + 3]
    table = torch.randn(B * beam, 10)
    table[:, 4] = table.view(B, beam, 10)[:, :1, 4].expand(B, beam).reshape(-1)
    prev = table[:, 4]
    assert not logits.is_contiguous() and not prev.is_contiguous()
    runnable(backend, "beam_candidates", logits, prev, beam=beam, step=5, max_len=50)
    got = ck.beam_candidates(logits, prev, beam=beam, step=5, max_len=50, backend=backend)
    want = ck.beam_candidates_ref(logits, prev, beam=beam, step=5, max_len=50)
    assert_candidates(backend, got, want, logits, prev, beam=beam, step=5, max_len=50)
    # ties break towards the lower beam (both backends' documented order)
    assert torch.equal(got.beams[:, :beam], torch.arange(beam).expand(B, beam))


@torch.no_grad()
def test_bf16_logits():
    logits, prev, forced, ignore = search_inputs(2, 5, 3001)
    logits = logits.bfloat16()
    kwargs = dict(beam=5, step=3, max_len=20, forced_len=forced, ignore=ignore)
    runnable("cpp", "beam_candidates", logits, prev, **kwargs)
    assert_same_candidates(ck.beam_candidates(logits, prev, backend="cpp", **kwargs),
                           ck.beam_candidates_ref(logits, prev, **kwargs))


@pytest.mark.parametrize("backend", ["cpp", "triton"])
@torch.no_grad()
def test_only_eos_at_max_len_and_forced_length(backend):
    """At max_len (and at a forced length) EOS is each row's only finite entry."""
    B, beam, V = 2, 3, 50
    logits, prev, _, _ = search_inputs(B, beam, V)
    runnable(backend, "beam_candidates", logits, prev, beam=beam, step=6, max_len=6)
    for kwargs in (dict(step=6, max_len=6), dict(step=4, max_len=9, forced_len=torch.full((B * beam,), 4))):
        got = ck.beam_candidates(logits, prev, beam=beam, backend=backend, **kwargs)
        finite = got.scores.isfinite()
        assert finite.sum(1).tolist() == [beam] * B
        assert torch.all(got.tokens[finite] == EOS) and torch.all(got.eos_mask == finite)
        assert_candidates(backend, got, ck.beam_candidates_ref(logits, prev, beam=beam, **kwargs), logits, prev,
                          beam=beam, **kwargs)


@pytest.mark.parametrize("V", [37, 300])
@torch.no_grad()
def test_triton_rows_in_several_lane_chunks(monkeypatch, V):
    """A row longer than the program's lanes: each lane keeps its own best C over several chunks
    (16 lanes here: 3 and 19 chunks), a NaN row, -inf entries and a fp64 input."""
    kernels = importlib.import_module("convs2s_kernels.ops.beam_candidates.triton_kernels")
    monkeypatch.setattr(kernels, "INTERPRETER_LANES", 16)
    monkeypatch.setattr(kernels, "GPU_LANES", 16)
    B, beam = 3, 4
    logits, prev, forced, ignore = search_inputs(B, beam, V, seed=V)
    logits[1, 5] = float("nan")
    logits[2, :: 3] = float("-inf")
    kwargs = dict(beam=beam, step=3, max_len=20, forced_len=forced, ignore=ignore, unkpen=0.5)
    runnable("triton", "beam_candidates", logits.double(), prev, **kwargs)
    got = ck.beam_candidates(logits.double(), prev, backend="triton", **kwargs)
    assert_a_best_choice(got, ck.beam_candidates_ref(logits, prev, **kwargs), logits, prev, **kwargs)
    finite = got.scores[0].isfinite()
    assert not torch.any(finite & (got.beams[0] == 1)), "the NaN row (sentence 0, beam 1) is all -inf"
    assert not torch.any(finite & (got.beams[0] == 2) & (got.tokens[0] % 3 == 0)), "its -inf entries stay -inf"


@torch.no_grad()
def test_triton_takes_a_step_on_the_device():
    """A (1,) tensor step (a recorded search step): the same choice as the int step, bit for bit."""
    B, beam, V = 2, 3, 60
    logits, prev, forced, ignore = search_inputs(B, beam, V)
    for step in (1, 4, 8):
        kwargs = dict(beam=beam, max_len=8, min_len=3, forced_len=forced, ignore=ignore)
        runnable("triton", "beam_candidates", logits, prev, step=step, **kwargs)
        want = ck.beam_candidates(logits, prev, step=step, backend="triton", **kwargs)
        got = ck.beam_candidates(logits, prev, step=torch.tensor([step]), backend="triton", **kwargs)
        for name, g, w in zip(want._fields, got, want):
            assert torch.equal(g, w), (step, name)


@pytest.mark.gpu
@pytest.mark.parametrize("B,beam,V", [(128, 5, 40000), (1, 5, 40000), (128, 1, 40000), (3, 5, 8000)])
@pytest.mark.parametrize("step,min_len", [(7, 2), ("device", 1), ("max_len", 1)])
@torch.no_grad()
def test_beam_candidates_paper_shapes_on_gpu(B, beam, V, step, min_len):
    """Table 3's batch over fconv_wmt_en_fr's vocabulary at beam 5 and 1, one sentence, on CUDA
    (bf16 logits, as the bf16 decoder gives them); every rule on; an int step, a step on the device
    (with some rows at their forced length) and the last step (only EOS)."""
    logits, prev, forced, ignore = search_inputs(B, beam, V)
    forced.fill_(30)
    forced[::3] = 7
    at = {7: 7, "device": torch.tensor([7], device="cuda"), "max_len": 40}[step]
    kwargs = dict(beam=beam, step=at, max_len=40, min_len=min_len, unkpen=0.5, forced_len=forced.cuda(),
                  ignore=ignore.cuda())
    logits, prev = logits.cuda().bfloat16(), prev.cuda()
    got = ck.beam_candidates(logits, prev, backend="triton", **kwargs)
    want = ck.beam_candidates_ref(logits, prev, **kwargs)
    cpu = {k: (v.cpu() if isinstance(v, torch.Tensor) else v) for k, v in kwargs.items()}
    assert_a_best_choice(ck.BeamCandidates(*(t.cpu() for t in got)), ck.BeamCandidates(*(t.cpu() for t in want)),
                         logits.cpu(), prev.cpu(), **cpu)


def test_input_errors():
    logits, prev, forced, ignore = search_inputs(2, 3, 40)
    base = dict(beam=3, step=2, max_len=10)
    with pytest.raises(ValueError, match="not a whole number of sentences x beam 4"):
        ck.beam_candidates(logits, prev, **dict(base, beam=4))
    with pytest.raises(ValueError, match="prev_scores .* needed after step 0"):
        ck.beam_candidates(logits, None, **base)
    with pytest.raises(ValueError, match="prev_scores must have shape"):
        ck.beam_candidates(logits, prev[:4], **base)
    with pytest.raises(TypeError, match="forced_len must be int32 or int64"):
        ck.beam_candidates(logits, prev, forced_len=forced.float().round().bool(), **base)
    with pytest.raises(ValueError, match="ignore must have shape"):
        ck.beam_candidates(logits, prev, ignore=ignore.t(), **base)
    with pytest.raises(ValueError, match="eos = 40 is not a token of the 40-word vocabulary"):
        ck.beam_candidates(logits, prev, eos=40, **base)
    with pytest.raises(ValueError, match="step must be a non-negative int"):
        ck.beam_candidates(logits, prev, **dict(base, step=-1))
    with pytest.raises(TypeError, match="logits must be a floating-point tensor"):
        ck.beam_candidates(logits.long(), prev, **base)
