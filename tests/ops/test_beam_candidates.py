"""``beam_candidates``: the cpp step against the reference (fairseq's step op by op) -- every rule
(NaN, PAD, UNK penalty, min/max length, forced lengths, ignored EOS), step 0, odd vocabularies,
strided inputs, bf16 logits, repeated beams (real ties) -- and the input errors."""

import pytest
import torch

import convs2s_kernels as ck
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


@pytest.mark.parametrize("B,beam,V", [(1, 1, 37), (3, 5, 1003), (2, 4, 40000), (4, 2, 17), (2, 3, 5)])
@pytest.mark.parametrize("step", [0, 1, 4, 7, 8, 12])
@pytest.mark.parametrize("rules", list(RULES))
@torch.no_grad()
def test_cpp_matches_reference(B, beam, V, step, rules):
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
    runnable("cpp", "beam_candidates", logits, prev, **kwargs)
    got = ck.beam_candidates(logits, prev, backend="cpp", **kwargs)
    want = ck.beam_candidates_ref(logits, prev, **kwargs)
    C = min(2 * beam, (1 if step == 0 else beam) * V - 1)
    assert got.scores.shape == (B, C) and got.tokens.dtype == torch.int64 and got.eos_mask.dtype == torch.bool
    assert_same_candidates(got, want)


@torch.no_grad()
def test_repeated_beams_tie_and_strided_inputs():
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
    runnable("cpp", "beam_candidates", logits, prev, beam=beam, step=5, max_len=50)
    got = ck.beam_candidates(logits, prev, beam=beam, step=5, max_len=50, backend="cpp")
    want = ck.beam_candidates_ref(logits, prev, beam=beam, step=5, max_len=50)
    assert_same_candidates(got, want)
    # ties break towards the lower beam (cpp's documented order)
    assert torch.equal(got.beams[:, :beam], torch.arange(beam).expand(B, beam))


@torch.no_grad()
def test_bf16_logits():
    logits, prev, forced, ignore = search_inputs(2, 5, 3001)
    logits = logits.bfloat16()
    kwargs = dict(beam=5, step=3, max_len=20, forced_len=forced, ignore=ignore)
    runnable("cpp", "beam_candidates", logits, prev, **kwargs)
    assert_same_candidates(ck.beam_candidates(logits, prev, backend="cpp", **kwargs),
                           ck.beam_candidates_ref(logits, prev, **kwargs))


@torch.no_grad()
def test_only_eos_at_max_len_and_forced_length():
    """At max_len (and at a forced length) EOS is each row's only finite entry."""
    B, beam, V = 2, 3, 50
    logits, prev, _, _ = search_inputs(B, beam, V)
    runnable("cpp", "beam_candidates", logits, prev, beam=beam, step=6, max_len=6)
    for kwargs in (dict(step=6, max_len=6), dict(step=4, max_len=9, forced_len=torch.full((B * beam,), 4))):
        got = ck.beam_candidates(logits, prev, beam=beam, backend="cpp", **kwargs)
        finite = got.scores.isfinite()
        assert finite.sum(1).tolist() == [beam] * B
        assert torch.all(got.tokens[finite] == EOS) and torch.all(got.eos_mask == finite)
        assert_same_candidates(got, ck.beam_candidates_ref(logits, prev, beam=beam, **kwargs))


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
