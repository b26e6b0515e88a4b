"""A decoding step recorded once and replayed (``convs2s.engine.graph``), checked on a CPU.

The op recorder holds a step to a CUDA graph's contract: a replay re-runs the recorded ATen
operations with the scalars they were recorded with, into the buffers they wrote. So a step
that keeps a Python number that changes (the position, a parent index), replaces a buffer
instead of writing it, or reads a tensor on the host decodes wrongly or fails here as it would
on a GPU. The same n-best lists with and without recording are the proof; the GPU test at the
end runs the real CUDA graphs.
"""

import sys

from collections import Counter

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import convs2s
import convs2s.engine.step as step_module
import convs2s.engine.graph as step_graph
import convs2s_kernels as ck
from convs2s_kernels.internal import trusted_indices
from convs2s.engine.graph import OpRecorder, StepGraph, StepGraphError, recorder_factory
from harness import require_or_skip

aten = torch.ops.aten
GEN = sys.modules["convs2s.generate"]  # the module (convs2s.generate is its function)
from test_host_reads import HostReads
from convs2s.engine import prepare, quantize_decoder_int8


# --- the recorder itself ------------------------------------------------------------------------
def test_a_replay_recomputes_from_the_buffers_with_the_recorded_scalars():
    x, out_buf = torch.arange(4.0), torch.zeros(4)
    scale = {"value": 2.0}

    def step():
        y = x * scale["value"] + 1  # a Python number: recorded as it is now
        out_buf.view(2, 2).copy_(y.flip(0).view(2, 2))  # views, and an in-place write through one
        return y

    rec = OpRecorder()
    y = rec.capture(step)
    assert torch.equal(y, torch.tensor([1.0, 3.0, 5.0, 7.0]))
    x.fill_(10.0)
    scale["value"] = 100.0  # a recording does not see Python values change
    rec.replay()
    assert torch.equal(y, torch.full((4,), 21.0)) and torch.equal(out_buf, torch.full((4,), 21.0))


@pytest.mark.parametrize("read", [lambda t: t.sum().item(), lambda t: t[t > 0], lambda t: t.nonzero(),
                                  lambda t: bool(t.any())], ids=["item", "bool-mask", "nonzero", "bool"])
def test_a_host_read_inside_a_recorded_step_is_an_error(read):
    t = torch.randn(5)
    with pytest.raises(StepGraphError, match="reads tensor values on the host"):
        OpRecorder().capture(lambda: read(t))


def test_kernels_the_recorder_cannot_see_are_refused():
    require_or_skip("cpp")
    x, w = torch.randn(2, 8), torch.randn(4, 8)
    with pytest.raises(StepGraphError, match=r"linear \(cpp\).*backend='reference'"):
        OpRecorder().capture(lambda: ck.linear(x, w, backend="cpp"))


class _Recorder:
    def __init__(self):
        self.log = []

    def capture(self, fn):
        self.log.append("capture")
        return fn()

    def replay(self):
        self.log.append("replay")
        return "replayed"


def test_a_step_graph_runs_eagerly_then_records_then_replays():
    calls, rec = [], _Recorder()
    graph = StepGraph(lambda: calls.append(1) or "ran", rec, torch.device("cpu"))
    assert [graph() for _ in range(4)] == ["ran", "ran", "replayed", "replayed"]
    assert len(calls) == 2 and rec.log == ["capture", "replay", "replay"]


def test_a_failed_recording_does_not_count():
    rec, fail = _Recorder(), [True]

    def step():
        if rec.log and fail[0]:  # the recording call fails once
            fail[0] = False
            raise RuntimeError("capture failed")
        return "ran"

    graph = StepGraph(step, rec, torch.device("cpu"))
    assert graph() == "ran"
    with pytest.raises(RuntimeError, match="capture failed"):
        graph()
    assert graph() == "ran" and graph() == "replayed"  # recorded again, then replayed


def test_the_choice_of_recorder_is_checked():
    cpu = torch.device("cpu")
    assert recorder_factory(None, cpu) is None and recorder_factory(False, cpu) is None
    assert isinstance(recorder_factory("record-ops", cpu)(cpu), OpRecorder)
    with pytest.raises(ValueError, match="needs the model on a CUDA device"):
        recorder_factory(True, cpu)
    model = convs2s.build_model("fconv_iwslt_de_en", 20, 20).eval()
    with pytest.raises(ValueError, match="cuda_graph must be None, True, False or 'record-ops'"):
        convs2s.generate(model, [[5, 6]], observer=convs2s.Observer(cuda_graph="yes"))


# --- recorded decoding ----------------------------------------------------------------------------
SOURCES = [[5, 6, 7, 8], [9, 10, 11, 12], [13, 14, 15, 16], [17, 18, 19, 20], [21, 22, 23, 24]]
FORCED = [9, 20, 3, 14, 6]  # sentences finishing at different steps: the batch shrinks in stages


def forced(cuda_graph, steps_per_graph: int = GEN.STEPS_PER_GRAPH) -> convs2s.Observer:
    """The search's hooks here: every sentence forced to its FORCED length, the step recorded or not."""
    return convs2s.Observer(forced_length=FORCED, cuda_graph=cuda_graph, steps_per_graph=steps_per_graph)


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    m = convs2s.build_model("fconv_iwslt_de_en", 40, 40).eval()
    m.backend = "reference"  # ATen operations only: what the op recorder can replay
    return m


def _assert_same_nbest(got, want, attention: bool):
    for g_list, w_list in zip(got, want):
        assert len(g_list) == len(w_list)
        for g, w in zip(g_list, w_list):
            assert torch.equal(g["tokens"], w["tokens"])
            assert g["score"] == pytest.approx(w["score"], abs=1e-5)
            torch.testing.assert_close(g["positional_scores"], w["positional_scores"], rtol=0, atol=1e-5)
            if attention:
                torch.testing.assert_close(g["attention"], w["attention"], rtol=0, atol=1e-5)


@pytest.fixture
def replays(monkeypatch):
    """How many recordings and replays the op recorder made."""
    counts = {"captures": 0, "replays": 0}
    capture, replay = OpRecorder.capture, OpRecorder.replay

    def counting_capture(self, fn):
        counts["captures"] += 1
        return capture(self, fn)

    def counting_replay(self):
        counts["replays"] += 1
        return replay(self)

    monkeypatch.setattr(OpRecorder, "capture", counting_capture)
    monkeypatch.setattr(OpRecorder, "replay", counting_replay)
    return counts


# Steps 0-20 (the longest sentence's EOS at 20, max_len 22); done sentences leave once they are half
# the batch (5 -> 2 -> 1 sentences), each segment a new recording after one eager step:
# one step a recording: steps 1, 10, 15 eager, 2, 11, 16 recorded, 14 replays;
# four: steps 1, 10, 15 eager, 2-5, 11-14, 16-19 recorded, 6-9 replayed, 20 eager (too near max_len
# for four), so that the host learns of sentence 3 (done at step 3) after step 5, the same segments.
SCHEDULE = {1: (3, 14), 4: (3, 1)}  # steps a recording -> (recordings, replays)


@pytest.mark.parametrize("steps_per_graph", sorted(SCHEDULE))
@pytest.mark.parametrize("return_attention", [False, True], ids=["no-attn", "attn"])
@pytest.mark.parametrize("fold_attention", [False, True], ids=["plain", "folded"])
@pytest.mark.parametrize("beam", [1, 5])
def test_recorded_steps_give_the_same_nbest_lists(model, replays, beam, fold_attention, return_attention,
                                                  steps_per_graph):
    kw = dict(beam=beam, nbest=beam, max_len_b=22, fold_attention=fold_attention, return_attention=return_attention)
    want = convs2s.generate(model, SOURCES, observer=forced(False), **kw)
    got = convs2s.generate(model, SOURCES, observer=forced("record-ops", steps_per_graph), **kw)
    _assert_same_nbest(got, want, return_attention)
    assert all(len(h[0]["tokens"]) == n + 1 for h, n in zip(got, FORCED))
    assert (replays["captures"], replays["replays"]) == SCHEDULE[steps_per_graph]


@pytest.mark.parametrize("steps_per_graph", [2, 3, 5, 7])
def test_any_steps_per_recording_gives_the_same_nbest_lists_and_steps(model, replays, steps_per_graph):
    """Sentences that finish inside a replay stay finished (their rows masked until they leave),
    and steps too near max_len run one by one: the same lists, and every step hook, for any
    count; after the last sentence is done at most ``steps_per_graph - 1`` more steps run."""
    kw = dict(beam=3, nbest=3, max_len_b=22)
    want_steps, got_steps = [], []
    with _Calls() as eager_calls:
        want = convs2s.generate(model, SOURCES, observer=convs2s.Observer(
            forced_length=FORCED, cuda_graph=False, on_step=want_steps.append), **kw)
    with _Calls() as recorded_calls:
        got = convs2s.generate(model, SOURCES, observer=convs2s.Observer(
            forced_length=FORCED, cuda_graph="record-ops", on_step=got_steps.append, steps_per_graph=steps_per_graph),
            **kw)
    _assert_same_nbest(got, want, False)
    assert want_steps == list(range(-1, max(FORCED) + 1))
    assert got_steps[:len(want_steps)] == want_steps and len(got_steps) - len(want_steps) < steps_per_graph
    assert got_steps == list(range(-1, len(got_steps) - 1)) and replays["captures"] >= 1
    # each step ran each attention layer's two products (scores, context) once, the steps after
    # the last EOS included (the hooks count the steps, -1 aside)
    per_step = 2 * sum(a is not None for a in model.decoder.attention)
    assert eager_calls.counts[aten.bmm.default] == (len(want_steps) - 1) * per_step
    assert recorded_calls.counts[aten.bmm.default] == (len(got_steps) - 1) * per_step


def test_max_len_is_reached_inside_a_recording_and_not_passed(model):
    """No forced lengths: random weights run every sentence to max_len. The max-length step (every
    sentence ends there) may be a recording's last; no step runs past it."""
    kw = dict(beam=2, nbest=2, max_len_b=9)  # max_len 9: steps 0-9; 1 eager, 2-5 and 6-9 in fours
    want = convs2s.generate(model, SOURCES, observer=convs2s.Observer(cuda_graph=False), **kw)
    for n in (4, 3):
        steps = []
        got = convs2s.generate(model, SOURCES, observer=convs2s.Observer(
            cuda_graph="record-ops", steps_per_graph=n, on_step=steps.append), **kw)
        _assert_same_nbest(got, want, False)
        assert max(steps) <= 9


@pytest.mark.parametrize("bad", [0, -2, 1.5, True, "4"])
def test_a_bad_steps_per_graph_is_named(model, bad):
    with pytest.raises(GEN.GenerationError, match="steps_per_graph must be an int >= 1"):
        convs2s.generate(model, SOURCES, observer=convs2s.Observer(steps_per_graph=bad))


class _Calls(TorchDispatchMode):
    """How many times each ATen operation ran (replays of a recording included)."""

    def __init__(self):
        super().__init__()
        self.counts = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.counts[func] += 1
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("steps_per_graph", sorted(SCHEDULE))
@pytest.mark.parametrize("fold_attention", [False, True], ids=["plain", "folded"])
def test_a_recorded_decoding_does_each_steps_work_once(model, replays, fold_attention, steps_per_graph):
    """Issue 50's "no work done twice": the warm-up, the recording and the replays together run
    each layer's step operations once a step, as eager decoding does, also across the batch's
    re-recordings when sentences leave."""
    per_layer = {aten.baddbmm.default if fold_attention else aten.bmm.default}  # each attention layer's scores
    ran = {}
    for mode in (False, "record-ops"):
        steps = []
        with _Calls() as calls:
            hooks = convs2s.Observer(forced_length=FORCED, on_step=steps.append, cuda_graph=mode,
                                     steps_per_graph=steps_per_graph)
            convs2s.generate(model, SOURCES, beam=3, max_len_b=22, fold_attention=fold_attention, observer=hooks)
        ran[mode] = (sum(calls.counts[f] for f in per_layer), len(steps))
    assert replays["captures"] == 3
    assert ran["record-ops"] == ran[False], ran
    layers = sum(a is not None for a in model.decoder.attention)
    assert ran[False][0] >= layers * max(FORCED), ran  # every step ran them (plus the encoder's, if any)


def test_recorded_int8_and_shortlist_steps_give_the_same_nbest_lists(model, replays):
    from convs2s.shortlist import Shortlist

    m = convs2s.build_model("fconv_iwslt_de_en", 40, 40).eval()
    m.load_state_dict(model.state_dict())
    m.backend = "reference"
    quantize_decoder_int8(m)
    shortlist = Shortlist({s: [s % 7 + 10, s % 5 + 20] for s in range(4, 40)}, 40, top=8)
    kw = dict(beam=3, nbest=2, max_len_b=22, fold_attention=True, shortlist=shortlist)
    want = convs2s.generate(m, SOURCES, observer=forced(False), **kw)
    got = convs2s.generate(m, SOURCES, observer=forced("record-ops"), **kw)
    _assert_same_nbest(got, want, False)
    assert replays["captures"] == 3 and replays["replays"] >= 1


def test_a_step_that_keeps_a_python_position_is_caught(model, monkeypatch):
    """The contract has teeth: a step that looks its position up by a Python number (the bug
    a CUDA graph would replay silently) decodes differently under the recorder."""
    kw = dict(beam=2, max_len_b=22)
    want = convs2s.generate(model, SOURCES, observer=forced(False), **kw)
    embedding = step_module.F.embedding

    def python_position(index, weight, *args, **kwargs):
        if index.shape == (1,):  # the step's position: read as a number, as an eager step may
            return weight[int(index.tolist()[0])].unsqueeze(0)
        return embedding(index, weight, *args, **kwargs)

    monkeypatch.setattr(step_module.F, "embedding", python_position)
    got = convs2s.generate(model, SOURCES, observer=forced("record-ops"), **kw)
    assert any(not torch.equal(g[0]["tokens"], w[0]["tokens"]) or abs(g[0]["score"] - w[0]["score"]) > 1e-4
               for g, w in zip(got, want))


def test_recorded_decoding_reads_nothing_back_per_step(model):
    counts = []
    for forced in ([2, 4, 3, 2, 3], [9, 20, 14, 12, 18]):
        steps = []
        with HostReads() as mode:
            hooks = convs2s.Observer(forced_length=forced, on_step=steps.append, cuda_graph="record-ops")
            convs2s.generate(model, SOURCES, beam=3, max_len_b=max(forced) + 2, observer=hooks)
        counts.append((mode.reads, len(steps)))
    assert counts[1][1] >= counts[0][1] + 15
    assert counts[0][0] == counts[1][0], counts


def test_a_recorded_search_keeps_its_counters_and_checks_its_step(model):
    """Drive the search as generate does, then look inside: the step count, the position and the
    device's step agree after recorded segments, and a call at the wrong step is refused."""
    gen = sys.modules["convs2s.generate"]
    src = torch.tensor([s + [2] for s in SOURCES])
    options = gen.SearchOptions(beam=3, max_len_b=22)
    search = gen._BeamSearch(prepare(model), src, options, forced("record-ops"), torch.tensor(FORCED))
    step, ran = 0, []
    with trusted_indices():
        while step < 12:
            if step > 0:
                search.leave(search.done_rows())
                ran.append(search.recorded_step(step))
            else:
                search.update(step, search.candidates(step, search.logits(step)))
                ran.append(1)
            step += ran[-1]
    # FORCED's sentences are done at steps 3, 6 and 9 (of 5): the host learns of the first after
    # step 5, of the others after step 9, when 3 of 5 leave and a new segment begins
    assert ran == [1, 1, 4, 4, 1, 4], ran
    state, recorded = search.state, search.recorded
    assert recorded.valid(search) and recorded.graph.calls == 2 and state.static  # warmed up, recorded
    assert state.step == 15 and int(state.static.position) == 1 + 15 + 1 and int(recorded.step_t) == 15
    with pytest.raises(ValueError, match="the recorded search is at step 15, not 14"):
        recorded(14)


def test_a_static_state_composes_two_reorders_before_a_step(model):
    """The search may reorder twice between steps (parents, then dropping sentences): the static
    state composes them as the eager one does."""
    enc = model.encode(torch.tensor([[5, 6, 7, 2], [8, 9, 10, 2]]))
    eager, static = (prepare(model).init_decoder_state(enc, 2) for _ in range(2))
    static.make_static()
    tokens = torch.tensor([2, 2, 2, 2])
    for state in (eager, static):
        state.static_step_ready() if state.static else None
        prepare(model).decode_step(tokens, state)
        state.static_step_done() if state.static else None
        state.reorder(torch.tensor([1, 1, 2, 3]))
        state.reorder(torch.tensor([3, 2, 1, 0]))
    static.static_step_ready()
    a, _ = prepare(model).decode_step(tokens, eager)
    b, _ = prepare(model).decode_step(tokens, static)
    static.static_step_done()
    assert static.step == eager.step == 2
    torch.testing.assert_close(a, b, rtol=0, atol=1e-6)
    static.reorder(torch.tensor([0, 1]), sentence_index=torch.tensor([0]))  # leaves static mode
    assert not static.static and static.pending_index is not None


# --- the real thing -----------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("fold_attention,return_attention", [(False, True), (True, False)], ids=["plain", "folded"])
@pytest.mark.parametrize("beam", [1, 5])
@pytest.mark.parametrize("steps_per_graph", sorted(SCHEDULE))
def test_cuda_graphs_give_the_same_nbest_lists(beam, fold_attention, return_attention, dtype, steps_per_graph,
                                               monkeypatch):
    require_or_skip("triton")
    torch.manual_seed(0)
    m = convs2s.build_model("fconv_iwslt_de_en", 40, 40).eval().to("cuda", dtype)
    m.use_backend("triton")
    counts = {"replays": 0}
    replay = step_graph.CudaRecorder.replay

    def counting_replay(self):
        counts["replays"] += 1
        return replay(self)

    monkeypatch.setattr(step_graph.CudaRecorder, "replay", counting_replay)
    kw = dict(beam=beam, nbest=beam, max_len_b=22, fold_attention=fold_attention, return_attention=return_attention)
    with ck.count_dispatches() as dispatched:
        want = convs2s.generate(m, SOURCES, observer=forced(False), **kw)
        got = convs2s.generate(m, SOURCES, observer=forced(None, steps_per_graph), **kw)  # graphs: CUDA's default
    # news of done sentences may arrive later than on a CPU: longer segments, no fewer replays
    assert counts["replays"] >= SCHEDULE[steps_per_graph][1] and dispatched[("conv_step", "triton")] > 0
    if dtype == torch.float32:
        _assert_same_nbest(got, want, return_attention)
    else:  # bf16: the same tokens; scores to bf16's rounding of products over other row counts
        for g, w in zip(got, want):
            assert torch.equal(g[0]["tokens"], w[0]["tokens"])
