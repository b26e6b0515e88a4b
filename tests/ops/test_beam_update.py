"""``beam_update``: the cpp and Triton steps against the reference (fairseq's finalisation and beam
advance, tensor op by tensor op) on random searches, bit for bit: sentences with hypotheses
already, sentences done, ignored candidates, EOS among the first ``beam``, the last step,
attention, strided candidates, a step on the device (Triton); and the input errors."""

import pytest
import torch

import convs2s_kernels as ck
from harness import require_or_skip

EOS = 2


def search_state(B0, B, k, step, max_len, src_len=0, seed=0):
    """Candidates of a random step plus the buffers of a search that has run ``step`` steps."""
    g = torch.Generator().manual_seed(seed)
    V, N = 30, B * k
    logits = torch.randn(N, V, generator=g)
    logits[:, EOS] += 2.5  # many EOS candidates
    prev = -torch.rand(N, generator=g) * 10
    ignore = torch.rand(B, k, generator=g) < 0.3
    cands = ck.beam_candidates_ref(logits, prev, beam=k, step=step, max_len=max_len, ignore=ignore)
    tokens = torch.randint(4, V, (N, max_len + 2), generator=g)
    scores = -torch.rand(N, max_len + 1, generator=g).cumsum(1)
    attn = torch.rand(N, src_len, max_len + 2, generator=g) if src_len else None
    finished = ck.FinishedHypotheses.empty(B0, k, max_len, src_len)
    finished.count.copy_(torch.randint(0, k + 1, (B0,), generator=g))
    finished.done.copy_(finished.count == k)
    finished.done[0] = True  # done early by max_len with fewer than k
    sent_ids = torch.randperm(B0, generator=g)[:B]
    return cands, tokens, scores, attn, ignore, sent_ids, finished


def runnable(*args, backend="cpp", **kwargs):
    """Skip (or fail, when required) unless ``backend`` runs beam_update on these inputs."""
    require_or_skip(backend)
    why = ck.backend_reasons(backend, "beam_update", args[2].device, *args, **kwargs)
    if why:
        pytest.skip("; ".join(why))


def clone(x):
    if x is None or isinstance(x, torch.Tensor):
        return None if x is None else x.clone()
    items = [clone(t) for t in x]
    return type(x)(*items) if hasattr(x, "_fields") else tuple(items)


@pytest.mark.parametrize("backend", ["cpp", "triton"])
@pytest.mark.parametrize("B0,B,k", [(1, 1, 1), (4, 3, 2), (6, 6, 5), (5, 2, 4)])
@pytest.mark.parametrize("step", [0, 1, 6, 9])
@pytest.mark.parametrize("src_len", [0, 3])
@torch.no_grad()
def test_matches_reference(backend, B0, B, k, step, src_len):
    max_len = 9
    cands, tokens, scores, attn, ignore, sent_ids, finished = search_state(B0, B, k, step, max_len, src_len, seed=step)
    kwargs = dict(lenpen=0.6, at_max_len=step == max_len, eos=EOS)
    args = (cands, step, tokens, scores, ignore, sent_ids, finished)
    runnable(*args, attn=attn, backend=backend, **kwargs)
    ref_bufs = clone((tokens, scores, attn, finished))
    want = ck.beam_update_ref(cands, step, ref_bufs[0], ref_bufs[1], ignore, sent_ids, ref_bufs[3], attn=ref_bufs[2],
                              **kwargs)
    got = ck.beam_update(*args, attn=attn, backend=backend, **kwargs)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    assert torch.equal(tokens, ref_bufs[0]) and torch.equal(scores, ref_bufs[1])
    if attn is not None:
        assert torch.equal(attn, ref_bufs[2])
    slots = B0 * k  # the scratch rows past the slots hold whatever the reference parked there
    for name, g, w in zip(finished._fields, finished, ref_bufs[3]):
        if g is None:
            continue
        if g.shape[0] == 2 * slots:
            g, w = g[:slots], w[:slots]
        assert torch.equal(g, w), name


@pytest.mark.parametrize("backend", ["cpp", "triton"])
@torch.no_grad()
def test_finishes_and_advances_as_fairseq_does(backend):
    """A hand-made step: sentence 0's best candidate ends, its next beam skips it."""
    B, k = 1, 2
    cands = ck.BeamCandidates(torch.tensor([[-1.0, -2.0, -3.0, -4.0]]), torch.tensor([[EOS, 7, 8, 9]]),
                              torch.tensor([[1, 0, 1, 0]]), torch.tensor([[True, False, False, False]]))
    tokens = torch.tensor([[EOS, 5, 0, 0], [EOS, 6, 0, 0]])
    scores = torch.tensor([[-0.5, 0.0, 0.0], [-0.25, 0.0, 0.0]])
    finished = ck.FinishedHypotheses.empty(1, k, 2)
    ignore = torch.zeros(B, k, dtype=torch.bool)
    args = (cands, 1, tokens, scores, ignore, torch.tensor([0]), finished)
    runnable(*args, backend=backend)
    parents, new_ignore = ck.beam_update(*args, lenpen=1.0, backend=backend)
    assert finished.count.tolist() == [1] and finished.done.tolist() == [False]
    assert finished.tokens[0, :2].tolist() == [6, EOS] and finished.lengths[0] == 2
    assert finished.pos_scores[0, :2].tolist() == [-0.25, -0.75] and finished.scores[0] == -0.5
    assert parents.tolist() == [0, 1] and new_ignore.tolist() == [[False, False]]
    assert tokens[:, :3].tolist() == [[EOS, 5, 7], [EOS, 6, 8]] and scores[:, 1].tolist() == [-2.0, -3.0]


def test_input_errors():
    cands, tokens, scores, attn, ignore, sent_ids, finished = search_state(3, 2, 2, 1, 5, src_len=2)
    with pytest.raises(ValueError, match="attn and finished.attn come together"):
        ck.beam_update(cands, 1, tokens, scores, ignore, sent_ids, finished)
    with pytest.raises(ValueError, match="step 7 does not fit the buffers"):
        ck.beam_update(cands, 7, tokens, scores, ignore, sent_ids, finished, attn=attn)
    with pytest.raises(ValueError, match="tokens must have shape"):
        ck.beam_update(cands, 1, tokens[:3], scores, ignore, sent_ids, finished, attn=attn)
    with pytest.raises(TypeError, match="cands must be a convs2s_kernels.BeamCandidates"):
        ck.beam_update(tuple(cands), 1, tokens, scores, ignore, sent_ids, finished, attn=attn)
    # candidates or finished buffers of another beam, or parents outside the beam, are refused, not
    # read past their ends (the cpp kernel's accessors do not check)
    with pytest.raises(ValueError, match=r"cands.beams must have shape \(B, C\), like cands.scores"):
        ck.beam_update(cands._replace(beams=cands.beams[:, :-1]), 1, tokens, scores, ignore, sent_ids, finished,
                       attn=attn)
    with pytest.raises(ValueError, match="finished.scores must have shape"):
        ck.beam_update(cands, 1, tokens, scores, ignore, sent_ids, finished._replace(scores=finished.scores[:-1]),
                       attn=attn)
    wide = ck.BeamCandidates(*(torch.cat([t, t[:, :1]], 1) for t in cands))
    with pytest.raises(ValueError, match="5 candidates per sentence; a beam of 2 takes 2 to 4"):
        ck.beam_update(wide, 1, tokens, scores, ignore, sent_ids, finished, attn=attn)
    require_or_skip("triton")  # on a CPU (the interpreter) the Triton glue checks what its kernel indexes by
    bad_beams = cands.beams.clone()
    bad_beams[0, 0] = 2
    with pytest.raises(ValueError, match=r"cands.beams values must lie in \[0, 1\]"):
        ck.beam_update(cands._replace(beams=bad_beams), 1, tokens, scores, ignore, sent_ids, finished, attn=attn,
                       backend="triton")
    with pytest.raises(ValueError, match=r"sent_ids values must lie in \[0, 2\]"):
        ck.beam_update(cands, 1, tokens, scores, ignore, sent_ids + 3, finished, attn=attn, backend="triton")
    require_or_skip("cpp")
    with pytest.raises(RuntimeError, match=r"cands.beams\[0\]\[0\] = 2 is not a beam in \[0, 2\)"):
        bad_beams = cands.beams.clone()
        bad_beams[0, 0] = 2
        ck.beam_update(cands._replace(beams=bad_beams), 1, tokens, scores, ignore, sent_ids, finished, attn=attn,
                       backend="cpp")
    why = ck.backend_reasons("cpp", "beam_update", tokens.device, cands, 1, tokens, scores.double(), ignore,
                             sent_ids, finished)
    assert why and "float32" in why[0]


# --- a step counted on the device (a recorded search step) --------------------------------------
def _search(step_as_tensor: bool, B=3, k=4, V=11, L=9, S=5, lenpen=0.6, forced=True, attention=True, seed=0,
            backend="reference"):
    """Both search ops over a whole batch, step by step, with int steps or (from step 1) a (1,)
    tensor step; the candidates by the reference, the update by ``backend``; returns the finished
    hypotheses."""
    g = torch.Generator().manual_seed(seed)
    tokens = torch.full((B * k, L + 2), 1, dtype=torch.long)
    tokens[:, 0] = 2
    scores, attn = torch.zeros(B * k, L + 1), torch.zeros(B * k, S, L + 2) if attention else None
    f = ck.FinishedHypotheses.empty(B, k, L, S if attention else 0)
    ignore, sent = torch.zeros(B, k, dtype=torch.bool), torch.arange(B)
    forced_len = torch.tensor([3, 5, 9]).repeat_interleave(k) if forced else None
    step_t = torch.zeros(1, dtype=torch.long)
    for step in range(L + 1):
        logits = torch.randn(B * k, V, generator=g)
        if attention:
            attn[:, :, step + 1] = torch.rand(B * k, S, generator=g)
        on_device = step_as_tensor and step > 0
        s = step_t.fill_(step) if on_device else step
        cands = ck.beam_candidates(logits, scores[:, step - 1] if step else None, beam=k, step=s, max_len=L,
                                   min_len=2, unkpen=0.5, forced_len=forced_len, ignore=ignore, backend="reference")
        at_max = step_t == L if on_device else step == L
        _, ignore = ck.beam_update(cands, s, tokens, scores, ignore, sent, f, lenpen=lenpen, at_max_len=at_max,
                                   attn=attn, backend=backend)
    return f


@pytest.mark.parametrize("backend", ["reference", "triton"])
@pytest.mark.parametrize("forced,attention", [(False, False), (True, True)], ids=["free", "forced-attn"])
@pytest.mark.parametrize("lenpen", [1.0, 0.6, 1.3])
def test_a_device_step_gives_the_same_hypotheses(lenpen, forced, attention, backend):
    """The reference's int steps against ``backend``'s tensor steps: the same hypotheses, bit for bit."""
    if backend != "reference":
        require_or_skip(backend)
    want = _search(False, lenpen=lenpen, forced=forced, attention=attention)
    got = _search(True, lenpen=lenpen, forced=forced, attention=attention, backend=backend)
    k = want.scores.shape[0] // (2 * want.count.numel())
    slots = want.count.numel() * k
    assert torch.equal(got.count, want.count) and torch.equal(got.done, want.done) and int(want.count.sum()) > 0
    assert torch.equal(got.lengths[:slots], want.lengths[:slots]) and torch.equal(got.scores[:slots], want.scores[:slots])
    for slot in range(slots):
        if slot % k < int(want.count[slot // k]):
            n = int(want.lengths[slot])
            assert torch.equal(got.tokens[slot, :n], want.tokens[slot, :n])
            assert torch.equal(got.pos_scores[slot, :n], want.pos_scores[slot, :n])
            if attention:
                assert torch.equal(got.attn[slot, :, :n], want.attn[slot, :, :n])


def test_a_device_step_is_checked_and_left_to_the_reference():
    B, k, V, L = 2, 2, 7, 5
    logits, prev = torch.randn(B * k, V), torch.zeros(B * k)
    with pytest.raises(ValueError, match=r"a tensor step must be a \(1,\) int64 tensor"):
        ck.beam_candidates(logits, prev, beam=k, step=torch.tensor([1, 2]), max_len=L)
    with pytest.raises(ValueError, match="prev_scores"):
        ck.beam_candidates(logits, None, beam=k, step=torch.tensor([1]), max_len=L)
    step = torch.tensor([1])
    from convs2s_kernels.ops.beam_candidates.cpp import CAPABILITY as candidates_cpp
    from convs2s_kernels.ops.beam_update.cpp import CAPABILITY as update_cpp

    assert candidates_cpp.extra(logits, prev, beam=k, step=step, max_len=L) == \
        ["cpp beam_candidates takes an int step, not a tensor"]
    with ck.count_dispatches() as counts:
        cands = ck.beam_candidates(logits, prev, beam=k, step=step, max_len=L)
    assert counts[("beam_candidates", "reference")] == 1
    ignore, sent, f = torch.zeros(B, k, dtype=torch.bool), torch.arange(B), ck.FinishedHypotheses.empty(B, k, L, 3)
    tokens, scores = torch.full((B * k, L + 2), 1), torch.zeros(B * k, L + 1)
    assert "cpp beam_update takes an int step, not a tensor" in update_cpp.extra(
        cands, step, tokens, scores, ignore, sent, f)
    for bad_tokens, bad_attn in ((tokens[:, :-1], torch.zeros(B * k, 3, L + 2)), (tokens, torch.zeros(B * k, 3, L + 3))):
        with pytest.raises(ValueError, match="a tensor step needs whole buffers"):
            ck.beam_update(cands, step, bad_tokens, scores, ignore, sent, f, at_max_len=step == L, attn=bad_attn)
    with pytest.raises(ValueError, match="at_max_len must be a one-element bool tensor"):
        ck.beam_update(cands, step, tokens, scores, ignore, sent, f, at_max_len=False,
                       attn=torch.zeros(B * k, 3, L + 2))


@pytest.mark.gpu
@pytest.mark.parametrize("B,k,attention", [(128, 5, True), (128, 1, False), (3, 5, False)])
@pytest.mark.parametrize("on_device,lenpen", [(True, 1.0), (True, 0.6), (False, 1.3)])
@torch.no_grad()
def test_beam_update_paper_shapes_on_gpu(B, k, attention, on_device, lenpen):
    """Table 3's batch at beam 5 (attention kept) and 1, and a small batch, at step 60 of a
    200-token limit, the step on the device or an int, on CUDA: Triton against the reference there
    (the length-normalised scores within an ulp: CUDA's eager division by a Python number multiplies
    by its reciprocal)."""
    L, S, step = 200, 30, 60
    g = torch.Generator().manual_seed(B + k)
    logits = torch.randn(B * k, 40, generator=g)
    logits[:, EOS] += 2.0
    ignore = torch.rand(B, k, generator=g) < 0.2
    cands = ck.beam_candidates_ref(logits, -torch.rand(B * k, generator=g) * 30, beam=k, step=step, max_len=L,
                                   ignore=ignore)
    tokens = torch.randint(4, 40000, (B * k, L + 2), generator=g)
    scores = -torch.rand(B * k, L + 1, generator=g).cumsum(1)
    attn = torch.rand(B * k, S, L + 2, generator=g) if attention else None
    finished = ck.FinishedHypotheses.empty(B, k, L, S if attention else 0)
    finished.count.copy_(torch.randint(0, k + 1, (B,), generator=g))
    finished.done.copy_(finished.count == k)
    cuda = lambda x: None if x is None else (x.cuda() if isinstance(x, torch.Tensor) else type(x)(*map(cuda, x)))  # noqa: E731
    step_t = torch.tensor([step], device="cuda") if on_device else step
    bufs = [cuda(t) for t in (tokens, scores, attn, finished)]
    ref = [cuda(t) for t in (tokens, scores, attn, finished)]
    args = (cuda(cands), step_t, bufs[0], bufs[1], ignore.cuda(), torch.arange(B, device="cuda"), bufs[3])
    kwargs = dict(lenpen=lenpen, at_max_len=step_t == L, eos=EOS)
    got = ck.beam_update(*args, attn=bufs[2], backend="triton", **kwargs)
    want = ck.beam_update_ref(args[0], step_t, ref[0], ref[1], args[4], args[5], ref[3], attn=ref[2], **kwargs)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    n = step + 2  # the columns a step has written (the reference's tensor step rewrites whole rows)
    assert torch.equal(bufs[0][:, :n], ref[0][:, :n]) and torch.equal(bufs[1][:, : n - 1], ref[1][:, : n - 1])
    if attention:
        assert torch.equal(bufs[2][:, :, :n], ref[2][:, :, :n])
    f, w = bufs[3], ref[3]
    assert torch.equal(f.count, w.count) and torch.equal(f.done, w.done)
    kept = torch.arange(B * k, device="cuda") % k < w.count.repeat_interleave(k)
    assert torch.equal(f.lengths[: B * k][kept], w.lengths[: B * k][kept])
    torch.testing.assert_close(f.scores[: B * k][kept], w.scores[: B * k][kept], rtol=1e-6, atol=0)
    assert torch.equal(f.tokens[: B * k][kept][:, : step + 1], w.tokens[: B * k][kept][:, : step + 1])
    assert torch.equal(f.pos_scores[: B * k][kept][:, : step + 1], w.pos_scores[: B * k][kept][:, : step + 1])
