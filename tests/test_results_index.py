"""The READMEs' quoted tables are rendered from the committed results and bench/results/index.json,
not typed into the READMEs."""

import json

import pytest

from convs2s_bench import results_index as ri


@pytest.mark.parametrize("which", sorted(ri.TARGETS))
def test_each_quoted_table_is_what_the_data_gives(which):
    path, make = ri.TARGETS[which]
    quoted = ri.quoted(path.read_text(), which)
    assert quoted is not None, f"{path} lost its {which} markers"
    assert quoted == make(), f"{path}'s {which} table differs from the data: run python3 -m convs2s_bench.results_index --write"


def test_every_indexed_table_exists_and_has_both_beams_of_both_rows():
    index = ri.load_index()
    for machine, date, ref, fast in ri.main_job_rows(index):
        assert set(ref) == set(fast) == {1, 5}, machine
        assert len({(r["backend"], r["decoder"], r["dtype"]) for r in fast.values()}) == 1, machine
        assert all(r["seconds"] > 0 for r in (*ref.values(), *fast.values()))
    dates = [e["measured"] for e in index["main_job"] + index["durations"]]
    assert all(len(d) == 10 and d[4] == d[7] == "-" for d in dates)


def test_a_changed_number_is_caught(tmp_path):
    results = tmp_path / "results"
    index = ri.load_index()
    entry = index["main_job"][0]
    data = json.loads((ri.RESULTS / entry["table"]).read_text())
    (results / entry["table"]).parent.mkdir(parents=True)
    (results / entry["table"]).write_text(json.dumps(data))
    one = dict(index, main_job=[entry])
    before = ri.main_job_table(one, results)
    data["rows"][0]["seconds"] *= 2
    (results / entry["table"]).write_text(json.dumps(data))
    assert ri.main_job_table(one, results) != before
