"""`convs2s bench vs-fairseq`: the plumbing between convs2s and a fairseq interpreter.

fairseq is never installed here (it is a peer, not a dependency), so these tests hand the command
a stand-in interpreter that answers the driver's request in the driver's result format from
convs2s's own generator (which reproduces fairseq's n-best lists: tests/test_fairseq_fixture.py).
They prove the request (sentences, batches, forced lengths, beam, threads, cached weights), the
timing and the agreement report; the real fairseq run is committed under bench/results/."""

import json
import textwrap

import pytest

from convs2s.cli import main
from convs2s_bench.vs_fairseq import VsFairseqError, agreement, compare, plan_batches, read_ids

STAND_IN = textwrap.dedent('''
    import json, os, sys
    driver, request, result = sys.argv[1:]
    assert os.path.basename(driver) == "fairseq_driver.py" and os.path.exists(driver)
    req = json.load(open(request))
    log = os.environ["FAKE_FAIRSEQ_LOG"]
    with open(log, "a") as f:
        f.write(json.dumps({k: req[k] for k in ("beam", "threads", "cache_linearized_weight", "forced", "batches")}) + "\\n")
    if os.environ.get("FAKE_FAIRSEQ_FAIL"):
        sys.exit("RuntimeError: something broke inside fairseq")
    # answers kept per request: torch is imported once per beam, not once per request
    answers = log + ".answers.json"
    key = json.dumps([req[k] for k in ("checkpoint", "sentences", "batches", "forced", "beam")])
    known = json.load(open(answers)) if os.path.exists(answers) else {}
    if key not in known:
        import convs2s
        model, _, _ = convs2s.load_fairseq(req["checkpoint"])
        model.fold_weight_norm().eval()
        nbest = [None] * len(req["sentences"])
        for idx, forced in zip(req["batches"], req["forced"]):
            hyps = convs2s.generate(model, [req["sentences"][i] for i in idx], beam=req["beam"], nbest=req["beam"],
                                    max_len_a=0, max_len_b=forced, min_len=forced)
            for i, h in zip(idx, hyps):
                nbest[i] = [dict(tokens=x["tokens"].tolist(), score=float(x["score"])) for x in h]
        known[key] = nbest
        json.dump(known, open(answers, "w"))
    nbest = json.loads(json.dumps(known[key]))
    if os.environ.get("FAKE_FAIRSEQ_DIFFER"):
        nbest[0][0]["tokens"][0] += 1
    json.dump(dict(fairseq="stand-in", torch="-", threads=req["threads"], batch_seconds=[0.5] * len(req["batches"]),
                   nbest=nbest), open(result, "w"))
''')


@pytest.fixture
def stand_in(fake_fairseq):
    return fake_fairseq(STAND_IN)


def test_vs_fairseq_times_both_and_checks_the_outputs(fixture_dir, stand_in, tmp_path, capsys):
    python, log = stand_in
    out_json = tmp_path / "vs.json"
    rc = main(["bench", "vs-fairseq", "--fairseq-python", str(python), "--checkpoint",
               str(fixture_dir / "checkpoint.pt"), "--input", str(fixture_dir / "source.ids"), "--beams", "3,1",
               "--repeats", "2", "--threads", "1", "--json", str(out_json)])
    out = capsys.readouterr().out
    assert rc == 0
    sentences = read_ids(str(fixture_dir / "source.ids"))
    batches, forced = plan_batches(sentences, 128)
    requests = [json.loads(line) for line in log.read_text().splitlines()]
    # 2 repeats x 2 beams x (stock, cached), interleaved with convs2s
    assert [(r["beam"], r["cache_linearized_weight"]) for r in requests] == [(3, False), (3, True), (1, False),
                                                                             (1, True)] * 2
    assert all(r["batches"] == batches and r["forced"] == forced and r["threads"] == 1 for r in requests)
    assert forced == [round(1.1 * len(sentences[b[0]])) for b in batches]
    result = json.loads(out_json.read_text())
    rows = {(r["system"], r["beam"]): r for r in result["rows"]}
    for beam in (1, 3):
        for system in ("fairseq", "fairseq-cached"):
            r = rows[(system, beam)]
            assert r["seconds"] == pytest.approx(0.5 * len(batches)) and r["repeats"] == 2
            assert r["convs2s_speedup"] == pytest.approx(r["seconds"] / rows[("convs2s", beam)]["seconds"])
            a = r["agreement_with_convs2s"]
            assert a["top1_identical"] == a["nbest_identical"] == len(sentences) and a["max_top1_score_diff"] < 1e-5
    assert "| fairseq-cached | 3 |" in out and f"{len(sentences)}/{len(sentences)}" in out


def test_vs_fairseq_with_int8_times_five_more_systems(fixture_dir, stand_in, monkeypatch):
    """``--int8`` / ``--int8-weights-only`` / ``--int7``: convs2s with int8 decoder weights (and
    int8, float or 7-bit activations) beside the fp32 run; ``--int8-encoder`` / ``--int7-encoder``
    the encoder's weights too; their outputs held against fairseq's; the model is back in float32
    after each."""
    import convs2s_bench.vs_fairseq as vs

    python, _ = stand_in
    quantised = []  # (decoder, encoder) int8 settings of every convs2s run
    run = vs.run_convs2s

    def recording_run(model, *args):
        # (int8 weights, the activations: None off, "float", or int8 / 7-bit rows; the weights' bits)
        from convs2s.engine import prepare

        derived = [[d for d in map(prepare(model).derived, part.modules()) if d is not None]
                   for part in (model.decoder, model.encoder)]
        parts = [[(m.use_int8, None if not m.use_int8 else m.int8_activation_bits if m.int8_activations else "float",
                   m.int8_weight_bits if m.use_int8 else None) for m in ds]
                 for ds in derived]
        quantised.append(tuple(p[0] if len(set(p)) == 1 else "mixed" for p in parts))
        return run(model, *args)

    monkeypatch.setattr(vs, "run_convs2s", recording_run)
    result = compare(fairseq_python=str(python), checkpoint=str(fixture_dir / "checkpoint.pt"), dicts=None,
                     input_ids=str(fixture_dir / "source.ids"), beams=[2], int8=True, int8_weights_only=True,
                     int7=True, int8_encoder=True, int7_encoder=True, w7a7_encoder=True, log=lambda m: None)
    rows = {r["system"]: r for r in result["rows"]}
    assert list(rows) == ["fairseq", "fairseq-cached", "convs2s", "convs2s-int8", "convs2s-int8w", "convs2s-int7",
                          "convs2s-int8e", "convs2s-int7e", "convs2s-w7a7e"]
    off = (False, None, None)
    assert quantised == [(off, off), ((True, 8, 8), off), ((True, "float", 8), off), ((True, 7, 8), off),
                         ((True, 8, 8), (True, 8, 8)), ((True, 7, 8), (True, 7, 8)), ((True, 7, 7), (True, 7, 8))]
    for system in ("convs2s-int8", "convs2s-int8w", "convs2s-int7", "convs2s-int8e", "convs2s-int7e", "convs2s-w7a7e"):
        a = rows[system]["agreement_with_fairseq"]
        assert a["sentences"] == len(read_ids(str(fixture_dir / "source.ids")))
        assert 0 <= a["top1_identical"] <= a["sentences"]
        assert rows[system]["convs2s_speedup"] == pytest.approx(rows[system]["seconds"] / rows["convs2s"]["seconds"])


def test_vs_fairseq_reports_disagreement(fixture_dir, stand_in, monkeypatch):
    python, _ = stand_in
    monkeypatch.setenv("FAKE_FAIRSEQ_DIFFER", "1")
    result = compare(fairseq_python=str(python), checkpoint=str(fixture_dir / "checkpoint.pt"), dicts=None,
                     input_ids=str(fixture_dir / "source.ids"), beams=[2], log=lambda m: None)
    a = result["rows"][1]["agreement_with_convs2s"]
    assert a["top1_identical"] == a["sentences"] - 1


def test_vs_fairseq_errors_name_the_problem(fixture_dir, stand_in, tmp_path, monkeypatch, capsys):
    python, _ = stand_in
    ckpt, ids = str(fixture_dir / "checkpoint.pt"), str(fixture_dir / "source.ids")
    assert main(["bench", "vs-fairseq", "--fairseq-python", str(tmp_path / "nope"), "--checkpoint", ckpt,
                 "--input", ids]) == 2
    assert f"--fairseq-python {tmp_path / 'nope'}: no such program" in capsys.readouterr().err
    bad = tmp_path / "bad.ids"
    bad.write_text("4 5 x\n")
    assert main(["bench", "vs-fairseq", "--fairseq-python", str(python), "--checkpoint", ckpt, "--input", str(bad)]) == 2
    assert "cannot read sentence ids" in capsys.readouterr().err
    bad.write_text("4 5 100000\n")
    assert main(["bench", "vs-fairseq", "--fairseq-python", str(python), "--checkpoint", ckpt, "--input", str(bad)]) == 2
    assert "word ids must lie in [4, 120)" in capsys.readouterr().err
    monkeypatch.setenv("FAKE_FAIRSEQ_FAIL", "1")
    with pytest.raises(VsFairseqError, match="something broke inside fairseq"):
        compare(fairseq_python=str(python), checkpoint=ckpt, dicts=None, input_ids=ids, beams=[1], log=lambda m: None)


def test_agreement_counts():
    a = [[{"tokens": [5, 2], "score": -1.0}], [{"tokens": [6, 2], "score": -2.0}]]
    b = [[{"tokens": [5, 2], "score": -1.5}], [{"tokens": [7, 2], "score": -2.0}]]
    assert agreement(a, b) == dict(sentences=2, top1_identical=1, nbest_identical=1, max_top1_score_diff=0.5)
