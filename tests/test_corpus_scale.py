"""convs2s_bench.corpus_scale: its ratios pair the runs made one after the other, and its writer's
capacity (fake workers posting canned translations over loopback) writes every chunk, in order."""

import json

import pytest

from convs2s_bench.corpus_scale import RATIOS, paired_ratios, writer_capacity


def test_ratios_pair_each_repeats_runs():
    """A machine twice as fast in the second repeat moves both runs of it: the paired ratio does not
    see it, where a ratio of medians would."""
    runs = {"plain 1x2": [10.0, 20.0, 10.0], "torchrun 1x2": [9.0, 19.6, 9.8], "torchrun 2x1": [9.9, 21.56, 10.78]}
    cell = {c: dict(lines_per_s=dict(runs=r)) for c, r in runs.items()}
    got = paired_ratios(cell)
    assert set(got) == set(RATIOS)
    coordination = got["coordination: torchrun 1x2 / plain 1x2"]
    assert coordination["runs"] == pytest.approx([0.9, 0.98, 0.98]) and coordination["median"] == pytest.approx(0.98)
    split = got["split: torchrun 2x1 / torchrun 1x2"]
    assert split["runs"] == pytest.approx([1.1, 1.1, 1.1]) and split["median"] == pytest.approx(1.1)


def test_writer_capacity_writes_every_chunk_in_order(tmp_path):
    got = writer_capacity(tmp_path, workers=3, chunks=12, chunk_size=5)
    assert got["chunks"] == 12 and got["chunks_per_s"] > 0 and got["lines_per_s"] == pytest.approx(got["chunks_per_s"] * 5)
    from convs2s_bench.workload import random_sentences, synthetic_lengths

    sources = random_sentences(synthetic_lengths()[:60], 40000, seed=2)  # the inputs writer_capacity makes
    assert (tmp_path / "capacity.txt").read_text() == "".join(" ".join(f"w{t}" for t in s) + "\n" for s in sources)
    assert not (tmp_path / "capacity.txt.journal").exists()  # finished: the journal is gone
    assert json.dumps(got)  # the record it writes
