"""The full-set estimate (convs2s_bench.estimate): batches as the full run makes them, the
sample, the per-batch cost model and its leave-one-out uncertainty, on synthetic timings whose
true total is known."""

import pytest

from convs2s.generate import length_batches
from convs2s_bench.estimate import (SIZE_ANCHORS, TRUNCATED_LENGTH, Batch, BatchTiming, estimate, full_set_batches,
                                    price, sample_batches)
from convs2s_bench.workload import NEWSTEST_SUBWORD_LENGTHS, forced_lengths, synthetic_lengths


def newstest_batches():
    lengths = synthetic_lengths()
    return full_set_batches(lengths, forced_lengths([[0] * L for L in lengths]), 128)


def test_full_set_batches_are_the_generators_own():
    lengths = synthetic_lengths()
    batches = newstest_batches()
    assert [list(b.indices) for b in batches] == length_batches(lengths, 128)
    assert sum(b.size for b in batches) == 6003 and max(b.size for b in batches) == 128
    for b in batches:
        assert {lengths[i] for i in b.indices} == {b.src_len}
        assert b.forced_len == round(1.1 * b.src_len) and b.steps == b.forced_len + 1


def test_subword_histogram_is_the_measured_one():
    import json
    from pathlib import Path

    measured = json.loads((Path(__file__).parents[1] / "bench" / "results" / "newstest-subword-lengths.json")
                          .read_text())["subword_length_histogram"]
    assert {int(k): v for k, v in measured.items()} == NEWSTEST_SUBWORD_LENGTHS
    lengths = synthetic_lengths()
    assert len(lengths) == 6003 and max(lengths) == 205 and abs(sum(lengths) / 6003 - 25.40) < 0.01


def test_sample_spans_sizes_and_keeps_the_longest():
    batches = newstest_batches()
    sample = sample_batches(batches)
    sizes = sorted(batches[i].size for i in sample)
    assert sizes[0] == 1 and sizes[-1] == 128
    assert all(min(abs(s - a) for s in sizes) <= a // 4 for a in SIZE_ANCHORS)  # every anchor has a near size
    longest = max(b.src_len for b in batches)
    assert any(batches[i].src_len == longest for i in sample)
    assert len(sample) <= len(SIZE_ANCHORS) + 1 and len(set(sample)) == len(sample)


def synthetic_timing(batch, cut=TRUNCATED_LENGTH, *, per_row=1e-3, per_step=5e-3, per_token=2e-5, first=0.01,
                     last=0.004):
    """A batch timed as the cost model assumes: prepare ~ tokens, steady steps ~ rows, costlier first
    and last steps."""
    steady = per_step + per_row * batch.size
    n_steps = min(batch.forced_len, cut) + 1
    steps = [steady + first] + [steady] * (n_steps - 2) + [steady + last]
    return BatchTiming(batch, per_token * batch.source_tokens, steps)


def true_seconds(batch, **kw):
    t = synthetic_timing(batch, cut=batch.forced_len, **kw)
    return t.prepare + sum(t.steps)


def test_cut_runs_extrapolate_to_the_whole_batch():
    b = Batch(tuple(range(40)), 30, 33)
    t = synthetic_timing(b)
    assert not t.complete and len(t.steps) == TRUNCATED_LENGTH + 1
    assert t.full_seconds() == pytest.approx(true_seconds(b), rel=1e-9)
    short = Batch((0,), 1, 1)
    ts = synthetic_timing(short)
    assert ts.complete and ts.full_seconds() == pytest.approx(ts.prepare + sum(ts.steps))


def test_estimate_recovers_a_linear_cost_model():
    """Steps linear in rows and preparation linear in tokens: exact inside the sample's range, flat
    outside it (a few small batches below the smallest sampled token count)."""
    batches = newstest_batches()
    timings = [synthetic_timing(batches[i]) for i in sample_batches(batches)]
    est = estimate(batches, timings)
    truth = sum(true_seconds(b) for b in batches)
    assert est.seconds == pytest.approx(truth, rel=1e-3)
    assert est.model_uncertainty < 0.01 * truth
    assert len(est.batch_seconds) == len(batches)


def test_estimate_error_and_uncertainty_on_a_curved_cost():
    """Per-step cost concave in rows (cache effects): the interpolation is no longer exact; the
    estimate stays within a few percent and the leave-one-out uncertainty is of that order."""
    batches = newstest_batches()

    def timing(b, cut=TRUNCATED_LENGTH):
        steady = 5e-3 + 2e-3 * b.size ** 0.8
        n = min(b.forced_len, cut) + 1
        return BatchTiming(b, 2e-5 * b.source_tokens, [steady] * n)

    est = estimate(batches, [timing(batches[i]) for i in sample_batches(batches)])
    truth = sum(0 + 2e-5 * b.source_tokens + (5e-3 + 2e-3 * b.size ** 0.8) * b.steps for b in batches)
    assert abs(est.seconds - truth) / truth < 0.03
    assert 0 < est.model_uncertainty < 0.1 * truth


def test_price_outside_the_sample():
    b1, b2 = Batch((0,), 5, 6), Batch(tuple(range(10)), 5, 6)
    timings = [BatchTiming(b1, 0.1, [0.01] * 4), BatchTiming(b2, 0.2, [0.02] * 4)]
    small, big = Batch((0,), 3, 3), Batch(tuple(range(50)), 9, 10)
    p_small, p_big = price([small, big], timings)
    assert p_small == pytest.approx(0.1 + 0.01 * 4)   # once (tokens 4 < 6): prepare of b1; steady of size 1
    # beyond both: steady flat at b2's; once along the last segment (0.1 s per 54 tokens), 500 tokens
    assert p_big == pytest.approx(0.1 + 0.1 * (500 - 6) / 54 + 0.02 * 11)


def test_estimate_needs_timings():
    with pytest.raises(ValueError, match="no timed sample batches"):
        estimate(newstest_batches(), [])
