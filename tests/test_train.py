"""The trainer: paper recipe on a synthetic copy task, resumption, several processes, bad input."""

import json
import math
import os
import signal
import subprocess
import sys
import time
import uuid

import pytest
import torch

import convs2s
from conftest import free_port, tagged_pids
from convs2s import cli
from convs2s.data import TokenDataset, write_data_folder
from convs2s.dictionary import Dictionary
from convs2s.fairseq_io import CheckpointError, read_checkpoint
from convs2s.special_tokens import PAD
from convs2s.flops import training_flops, width3_conv_elements
from convs2s.train import (TRAIN_STATE_KEY, StopKind, StopReason, TrainConfig, Trainer, TrainingDiverged,
                           label_smoothed_nll, winograd_tile_ran)

VOCAB = 12
TINY = dict(encoder_embed_dim=64, decoder_embed_dim=64, decoder_out_embed_dim=64,
            encoder_layers="[(64, 3)] * 3", decoder_layers="[(64, 3)] * 3", dropout=0.0)


def random_sequences(n, seed):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(4, 4 + VOCAB, (int(torch.randint(3, 9, (1,), generator=g)),), generator=g).tolist()
            for _ in range(n)]


def make_copy_data(path, n_train, seed=0):
    """A data folder whose targets copy the sources: tokens w0..w11."""
    d = Dictionary([f"w{i}" for i in range(VOCAB)])
    train, valid = random_sequences(n_train, seed), random_sequences(100, seed + 1)
    write_data_folder(path, "src", "tgt", d, d, {"train": TokenDataset(train, train),
                                                  "valid": TokenDataset(valid, valid)})
    return str(path)


@pytest.fixture(scope="module")
def copy_data(tmp_path_factory):
    return make_copy_data(tmp_path_factory.mktemp("copy") / "bin", 400)


def tiny_config(data, save_dir, **kw):
    overrides = dict(TINY, **kw.pop("model_overrides", {}))
    defaults = dict(arch="fconv", model_overrides=overrides, max_tokens=500, log_interval=1, threads=1)
    defaults.update(kw)
    return TrainConfig(data=data, save_dir=str(save_dir), **defaults)


def read_log(save_dir, kind="train"):
    with open(os.path.join(save_dir, "train_log.jsonl"), encoding="utf-8") as f:
        return [r for r in map(json.loads, f) if r["kind"] == kind]


def losses_by_update(save_dir):
    """update -> loss; a re-done update (after a hard kill) must repeat its loss exactly."""
    out = {}
    for r in read_log(save_dir):
        if r["update"] in out:
            assert out[r["update"]] == r["loss"], f"update {r['update']} gave another loss after resuming"
        out[r["update"]] = r["loss"]
    return out


QUIET = dict(log=lambda *a, **k: None)


# --- pieces of the recipe ---------------------------------------------------------------------
def test_label_smoothed_nll_matches_fairseq_formula():
    torch.manual_seed(0)
    V, eps = 7, 0.1
    logits = torch.randn(2, 5, V, dtype=torch.float64)
    target = torch.randint(4, V, (2, 5))
    target[1, 3:] = PAD
    loss, nll = label_smoothed_nll(logits, target, eps)
    lp = logits.log_softmax(-1)
    want_loss = want_nll = 0.0
    for b in range(2):
        for t in range(5):
            if target[b, t] == PAD:
                continue
            y = target[b, t]
            want_nll += -lp[b, t, y]
            want_loss += -(1 - eps) * lp[b, t, y] - eps / (V - 1) * (lp[b, t].sum() - lp[b, t, y])
    torch.testing.assert_close(nll.double(), torch.as_tensor(want_nll), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(loss.double(), torch.as_tensor(want_loss), rtol=1e-6, atol=1e-6)


def test_torch_nesterov_sgd_equals_fairseq_nag_across_lr_changes():
    """fairseq's NAG (velocity in parameter units, rescaled on lr changes) vs the optimiser we use."""
    torch.manual_seed(0)
    theta0 = torch.randn(10, dtype=torch.float64)
    grads = [torch.randn(10, dtype=torch.float64) for _ in range(8)]
    lrs = [0.25] * 3 + [0.025] * 3 + [0.0025] * 2
    mu = 0.99
    theta, buf, lr_old = theta0.clone(), torch.zeros(10, dtype=torch.float64), lrs[0]
    for g, lr in zip(grads, lrs):
        c = lr / lr_old
        theta = theta + mu * mu * c * buf - (1 + mu) * lr * g
        buf = mu * c * buf - lr * g
        lr_old = lr
    p = torch.nn.Parameter(theta0.clone())
    opt = torch.optim.SGD([p], lr=lrs[0], momentum=mu, nesterov=True)
    for g, lr in zip(grads, lrs):
        opt.param_groups[0]["lr"] = lr
        p.grad = g.clone()
        opt.step()
    torch.testing.assert_close(p.detach(), theta, rtol=1e-12, atol=1e-12)


def test_training_flops_count_the_products_winograd_runs():
    """F(m, 3) runs (m + 2) / 3m of a width-3 convolution's products, forward and backward; the
    other layers' counts are unchanged; the tile is read from the labels of the ops that ran."""
    model = convs2s.build_model("fconv_iwslt_de_en", 30, 40)
    src, tgt = [7, 11], [9, 5]
    full = training_flops(model, src, tgt)
    conv = width3_conv_elements(model.encoder) * sum(src) + width3_conv_elements(model.decoder) * sum(tgt)
    assert conv > 0
    for m in (2, 4):
        saved = 3 * 2 * conv * (1 - (m + 2) / (3 * m))
        assert training_flops(model, src, tgt, m) == pytest.approx(full - saved, rel=1e-12)
    assert winograd_tile_ran({("conv_glu", "cpp, winograd F(4,3)"): 7, ("dropout", "cpp"): 10}) == 4
    assert winograd_tile_ran({("conv_glu", "cpp"): 7, ("output_loss", "cpp"): 1}) == 0


# --- learning ------------------------------------------------------------------------------
def test_copy_task_reaches_near_zero_loss_and_decodes_held_out_inputs(tmp_path):
    data = make_copy_data(tmp_path / "bin", 3000)
    cfg = tiny_config(data, tmp_path / "ckpt", max_tokens=1000, max_update=170, log_interval=10,
                      validate_interval_updates=85)
    start = time.perf_counter()
    summary = Trainer(cfg, **QUIET).train()
    assert time.perf_counter() - start < 120  # "under a minute" on an idle 2-core machine
    assert summary["reason"] == "reached --max-update 170"
    assert read_log(tmp_path / "ckpt")[-1]["loss"] < 0.1
    assert summary["best_valid_ppl"] < 1.05
    # the roofline: each window's FLOP/s against the GEMM rate measured at the start, and the kernels that ran
    assert all(0 < r["gflops_s"] and 0 < r["of_gemm_peak"] < 1 for r in read_log(tmp_path / "ckpt"))
    (kernels,) = read_log(tmp_path / "ckpt", "kernels")
    assert kernels["update"] == 1 and any(k.startswith("conv_glu") for k in kernels["ran"])

    # the written checkpoint is a fairseq checkpoint the generator reads
    model, src_dict, tgt_dict = convs2s.load_fairseq(tmp_path / "ckpt" / "checkpoint_best.pt")
    held_out = random_sequences(50, seed=99)
    hyps = convs2s.greedy(model.eval(), held_out, max_len_b=12)
    exact = sum(h["tokens"][:-1].tolist() == src for h, src in zip(hyps, held_out))
    assert exact >= 45, f"greedy copied only {exact}/50 held-out inputs"

    text = tmp_path / "in.txt"
    text.write_text("\n".join(" ".join(src_dict[i] for i in s) for s in held_out[:10]) + "\n")
    out = tmp_path / "out.txt"
    assert cli.main(["translate", "--fairseq-checkpoint", str(tmp_path / "ckpt" / "checkpoint_best.pt"),
                     "--input", str(text), "--output", str(out), "--beam", "5"]) == 0
    copied = sum(a == b for a, b in zip(out.read_text().splitlines(), text.read_text().splitlines()))
    assert copied >= 9


# --- resumption --------------------------------------------------------------------------
def test_stop_and_resume_equals_an_uninterrupted_run(copy_data, tmp_path):
    kw = dict(max_tokens=300, validate_interval_updates=4, model_overrides=dict(dropout=0.2), label_smoothing=0.1)
    Trainer(tiny_config(copy_data, tmp_path / "full", max_update=14, **kw), **QUIET).train()
    Trainer(tiny_config(copy_data, tmp_path / "part", max_update=6, **kw), **QUIET).train()
    state = read_checkpoint(tmp_path / "part" / "checkpoint_last.pt")[TRAIN_STATE_KEY]
    assert state["progress"]["num_updates"] == 6
    Trainer(tiny_config(copy_data, tmp_path / "part", max_update=14, **kw), **QUIET).train(resume=True)
    full, part = losses_by_update(tmp_path / "full"), losses_by_update(tmp_path / "part")
    assert sorted(full) == list(range(1, 15)) and full == part
    assert [r["valid_nll"] for r in read_log(tmp_path / "full", "valid")] == \
           [r["valid_nll"] for r in read_log(tmp_path / "part", "valid")]
    a = read_checkpoint(tmp_path / "full" / "checkpoint_last.pt")["model"]
    b = read_checkpoint(tmp_path / "part" / "checkpoint_last.pt")["model"]
    assert all(torch.equal(a[k], b[k]) for k in a)


def _train_cmd(data, save_dir, *extra):
    opts = [f"--model-option={k}={v}" for k, v in TINY.items() if k != "dropout"]
    return [sys.executable, "-m", "convs2s", "train", data, "--save-dir", str(save_dir), "--arch", "fconv",
            "--max-tokens", "300", "--log-interval", "1", "--threads", "1", "--dropout", "0.1", *opts, *extra]


def _wait_for_updates(save_dir, n, proc, timeout=120):
    log = os.path.join(save_dir, "train_log.jsonl")
    deadline = time.time() + timeout
    while time.time() < deadline:
        if os.path.exists(log) and len(read_log(save_dir)) >= n:
            return
        if proc.poll() is not None:
            pytest.fail(f"training exited early: {proc.stderr.read().decode()}")
        time.sleep(0.05)
    pytest.fail("training made no progress")


def test_hard_kill_then_resume_continues_the_same_loss_curve(copy_data, tmp_path):
    killed = tmp_path / "killed"
    proc = subprocess.Popen(_train_cmd(copy_data, killed, "--save-interval", "1", "--max-update", "400"),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _wait_for_updates(killed, 5, proc)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    done = max(losses_by_update(killed))
    target = done + 4
    subprocess.run(_train_cmd(copy_data, killed, "--max-update", str(target), "--resume"), check=True,
                   capture_output=True)
    subprocess.run(_train_cmd(copy_data, tmp_path / "full", "--max-update", str(target)), check=True,
                   capture_output=True)
    assert losses_by_update(killed) == losses_by_update(tmp_path / "full")
    assert sorted(losses_by_update(killed)) == list(range(1, target + 1))


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_a_stop_signal_stops_after_the_update_and_keeps_the_position(copy_data, tmp_path, sig):
    """SIGHUP too: a closed terminal or dropped ssh session keeps the run's position."""
    save = tmp_path / "run"
    proc = subprocess.Popen(_train_cmd(copy_data, save, "--max-update", "100000"),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _wait_for_updates(save, 3, proc)
    proc.send_signal(sig)
    assert proc.wait(timeout=60) == 130
    state = read_checkpoint(save / "checkpoint_last.pt")[TRAIN_STATE_KEY]
    assert state["progress"]["num_updates"] == max(losses_by_update(save))


def test_stop_reasons_are_values_with_the_printed_message(copy_data, tmp_path):
    trainer = Trainer(tiny_config(copy_data, tmp_path, max_update=2), **QUIET)
    summary = trainer.train()
    assert summary["stop"] is StopKind.MAX_UPDATE and summary["reason"] == "reached --max-update 2"
    assert json.loads(json.dumps(summary))["stop"] == "max-update", "the summary stays JSON-serialisable"
    c, p = trainer.cfg, trainer.progress
    c.max_update = 0
    assert trainer._done() is None
    trainer._stop_signal = "SIGTERM"
    assert trainer._done_or_signalled() == StopReason(StopKind.SIGNAL, "stopped by SIGTERM")
    c.max_time_minutes, p.train_seconds = 0.5, 30.0
    assert trainer._done() == StopReason(StopKind.MAX_TIME, "reached --max-time 0.5 min")
    c.max_epoch, p.epoch = 2, 3
    assert trainer._done() == StopReason(StopKind.MAX_EPOCH, "finished --max-epoch 2")
    p.lr = c.min_lr / 2
    reason = trainer._done_or_signalled()  # a stopping rule wins over the signal
    assert reason.kind is StopKind.MIN_LR and str(reason) == f"learning rate {p.lr:g} fell below --min-lr 0.0001"
    # only a stop between validations writes checkpoint_last.pt at the exact position
    assert [k.value for k in StopKind if StopReason(k, "").mid_epoch] == ["max-update", "max-time", "signal"]


def test_a_second_signal_stops_at_once(copy_data, tmp_path):
    """The first signal asks for a stop after the update; a second (a long validation, say) raises
    KeyboardInterrupt at once, and the handlers from before come back."""
    trainer = Trainer(tiny_config(copy_data, tmp_path), **QUIET)
    before = signal.getsignal(signal.SIGTERM)
    previous = trainer._install_signal_handlers()
    try:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.05)
        assert trainer._stop_signal == "SIGTERM"
        with pytest.raises(KeyboardInterrupt, match="a second SIGTERM"):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(1)
        assert signal.getsignal(signal.SIGTERM) is before
    finally:
        for sig, h in previous.items():
            signal.signal(sig, h)


def test_resume_takes_this_runs_momentum_and_weight_decay(copy_data, tmp_path):
    Trainer(tiny_config(copy_data, tmp_path, max_update=2), **QUIET).train()
    trainer = Trainer(tiny_config(copy_data, tmp_path, max_update=3, momentum=0.9, weight_decay=1e-4), **QUIET)
    trainer.train(resume=True)
    assert [(g["momentum"], g["weight_decay"]) for g in trainer.optimizer.param_groups] == [(0.9, 1e-4)]
    state = read_checkpoint(tmp_path / "checkpoint_last.pt")[TRAIN_STATE_KEY]
    assert state["config"]["momentum"] == 0.9 and state["optimizer"]["param_groups"][0]["momentum"] == 0.9


def test_a_validation_example_too_long_is_refused_before_training(tmp_path):
    d = Dictionary([f"w{i}" for i in range(VOCAB)])
    short, long = [[5, 6, 7]] * 4, [[5] * 40]
    write_data_folder(tmp_path / "bin", "src", "tgt", d, d, {"train": TokenDataset(short, short),
                                                             "valid": TokenDataset(long, long)})
    with pytest.raises(convs2s.data.DataError, match="1 validation examples exceed the model's 30 positions"):
        Trainer(tiny_config(str(tmp_path / "bin"), tmp_path / "a", model_overrides=dict(max_source_positions=32,
                                                                                         max_target_positions=32)),
                **QUIET)
    with pytest.raises(convs2s.data.DataError, match="validation set: example 0 has 41 tokens, more than "
                                                     "--max-tokens 30"):
        Trainer(tiny_config(str(tmp_path / "bin"), tmp_path / "b", max_tokens=30), **QUIET)


def test_validation_times_no_kernels(copy_data, tmp_path, monkeypatch):
    """Validation runs the model's own forward, which asks for no kernel choice (only the decoding
    engine does): measuring one there would stall training on every rank at once, whatever
    CONVS2S_TUNE says."""
    import convs2s.engine  # noqa: F401  (a subpackage: imported here, not by whichever test ran before)
    from convs2s_kernels import tune, tune_cache
    from convs2s_kernels.tune import policy
    from harness import require_or_skip

    require_or_skip("cpp")
    monkeypatch.setenv(tune.ENV, "1")
    monkeypatch.setenv(tune_cache.DIR_ENV, str(tmp_path / "cache"))
    timed = []
    monkeypatch.setattr(policy, "measure", lambda shape: timed.append(shape.name) or pytest.fail("timed"))
    trainer = Trainer(tiny_config(copy_data, tmp_path), **QUIET)
    tune.forget()
    try:
        assert math.isfinite(trainer.validate()) and timed == []
        with tune.measuring(True), torch.no_grad():  # measuring on: still nothing asked
            trainer._validation_sums([[0]], torch.zeros(2, dtype=torch.float64))
        assert timed == []
        with tune.measuring(True), torch.no_grad(), pytest.raises(pytest.fail.Exception):  # the engine asks
            convs2s.engine.prepare(trainer.model).encode(torch.tensor([[5, 6, 2]]))
    finally:
        tune.forget()


# --- several processes -------------------------------------------------------------------
def test_two_gloo_processes_equal_one_process_with_the_same_global_batch(copy_data, tmp_path):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    two = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "-m", "convs2s",
         *_train_cmd(copy_data, tmp_path / "two", "--max-update", "6")[3:]],
        env=env, capture_output=True, text=True, timeout=300)
    assert two.returncode == 0, two.stderr[-3000:]
    subprocess.run(_train_cmd(copy_data, tmp_path / "one", "--max-update", "6", "--update-freq", "2"),
                   check=True, capture_output=True, env=env)
    a = read_checkpoint(tmp_path / "two" / "checkpoint_last.pt")
    b = read_checkpoint(tmp_path / "one" / "checkpoint_last.pt")
    assert a[TRAIN_STATE_KEY]["world_size"] == 2 and b[TRAIN_STATE_KEY]["world_size"] == 1
    for k in b["model"]:
        torch.testing.assert_close(a["model"][k], b["model"][k], rtol=1e-4, atol=1e-5, msg=k)
    la, lb = losses_by_update(tmp_path / "two"), losses_by_update(tmp_path / "one")
    assert sorted(la) == sorted(lb) == list(range(1, 7))
    for u in la:
        assert math.isclose(la[u], lb[u], rel_tol=1e-4)
    # the update changed the weights: the comparison is not between two untouched models
    init = Trainer(tiny_config(copy_data, tmp_path / "init", model_overrides=dict(dropout=0.1)), **QUIET).model
    assert not torch.equal(init.state_dict()["decoder.fc3.weight_v"], b["model"]["decoder.fc3.weight_v"])


def _two_nodes(data, save_dir, *extra, restarts=0, env=None):
    """Two torchrun commands, one process each, meeting through a c10d rendezvous on 127.0.0.1 as two
    machines would (the same save folder: only rank 0 writes)."""
    launch = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1",
              "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{free_port()}", "--rdzv-id", uuid.uuid4().hex,
              "--max-restarts", str(restarts), "--monitor-interval", "0.1", "-m", "convs2s"]
    cmd = launch + _train_cmd(data, save_dir, *extra)[3:]
    env = dict(env or os.environ, OMP_NUM_THREADS="1")
    return [subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for _ in range(2)]


def _finish(nodes, timeout=300) -> str:
    """Both nodes' output, once both ended well."""
    said = ""
    for node in nodes:
        out, err = node.communicate(timeout=timeout)
        assert node.returncode == 0, err[-3000:]
        said += out + err
    return said


def test_two_nodes_equal_one_process_with_the_same_global_batch(copy_data, tmp_path):
    _finish(_two_nodes(copy_data, tmp_path / "two", "--max-update", "6"))
    subprocess.run(_train_cmd(copy_data, tmp_path / "one", "--max-update", "6", "--update-freq", "2"),
                   check=True, capture_output=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
    a = read_checkpoint(tmp_path / "two" / "checkpoint_last.pt")
    b = read_checkpoint(tmp_path / "one" / "checkpoint_last.pt")
    assert a[TRAIN_STATE_KEY]["world_size"] == 2
    for k in b["model"]:
        torch.testing.assert_close(a["model"][k], b["model"][k], rtol=1e-4, atol=1e-5, msg=k)
    la, lb = losses_by_update(tmp_path / "two"), losses_by_update(tmp_path / "one")
    assert sorted(la) == sorted(lb) == list(range(1, 7))
    assert all(math.isclose(la[u], lb[u], rel_tol=1e-4) for u in la)


def test_a_killed_node_worker_is_restarted_and_resumes_the_same_loss_curve(copy_data, tmp_path):
    """SIGKILL one node's worker under --max-restarts: both nodes restart, continue from
    checkpoint_last.pt without being told (--resume), and end on the uninterrupted run's curve."""
    tag, run = uuid.uuid4().hex, tmp_path / "killed"
    nodes = _two_nodes(copy_data, run, "--max-update", "40", "--save-interval", "1", restarts=1,
                       env=dict(os.environ, CONVS2S_TEST_TAG=tag))
    _wait_for_updates(run, 5, nodes[0])
    pids = tagged_pids(tag, 1)
    assert len(pids) == 1
    os.kill(pids[0], signal.SIGKILL)
    assert "resumed from" in _finish(nodes)
    subprocess.run(_train_cmd(copy_data, tmp_path / "one", "--max-update", "40", "--update-freq", "2"),
                   check=True, capture_output=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
    killed, whole = losses_by_update(run), losses_by_update(tmp_path / "one")  # a re-done update repeats its loss
    assert sorted(killed) == sorted(whole) == list(range(1, 41))
    assert all(math.isclose(killed[u], whole[u], rel_tol=1e-4) for u in whole)


def test_two_processes_stop_together_at_max_time(copy_data, tmp_path):
    """Only the main process saves, so the two clocks drift apart by the saves' time: the processes
    take the longest of them, and stop at the same update with the last checkpoint written."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    run = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "-m", "convs2s",
         *_train_cmd(copy_data, tmp_path / "two", "--max-time", "0.03", "--save-interval", "1", "--min-lr", "0")[3:]],
        env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "done: reached --max-time 0.03 min" in run.stdout + run.stderr  # not a plateau's --min-lr
    state = read_checkpoint(tmp_path / "two" / "checkpoint_last.pt")[TRAIN_STATE_KEY]
    assert state["progress"]["train_seconds"] >= 0.03 * 60
    assert state["progress"]["num_updates"] == max(losses_by_update(tmp_path / "two"))


# --- bad input -----------------------------------------------------------------------------
def test_nan_loss_stops_with_a_clear_error_and_keeps_the_last_good_checkpoint(copy_data, tmp_path):
    trainer = Trainer(tiny_config(copy_data, tmp_path, max_update=50, save_interval_updates=1), **QUIET)
    forward = trainer.model.forward
    calls = {"n": 0}

    def poisoned(*args, **kwargs):
        calls["n"] += 1
        logits, attn = forward(*args, **kwargs)
        return (logits * float("nan") if calls["n"] > 3 else logits), attn

    trainer.model.forward = poisoned
    with pytest.raises(TrainingDiverged, match="became nan at update 4"):
        trainer.train()
    ckpt = read_checkpoint(tmp_path / "checkpoint_last.pt")
    assert ckpt[TRAIN_STATE_KEY]["progress"]["num_updates"] == 3
    assert all(torch.isfinite(v).all() for v in ckpt["model"].values())


def test_resume_refuses_corrupt_mismatched_or_unasked_checkpoints(copy_data, tmp_path):
    Trainer(tiny_config(copy_data, tmp_path, max_update=2), **QUIET).train()
    with pytest.raises(CheckpointError, match="pass --resume"):
        Trainer(tiny_config(copy_data, tmp_path, max_update=4), **QUIET).train()
    with pytest.raises(CheckpointError, match="max_tokens: checkpoint 500 vs now 400"):
        Trainer(tiny_config(copy_data, tmp_path, max_update=4, max_tokens=400), **QUIET).train(resume=True)
    path = tmp_path / "checkpoint_last.pt"
    path.write_bytes(path.read_bytes()[:1000])
    with pytest.raises(CheckpointError, match="corrupt or truncated"):
        Trainer(tiny_config(copy_data, tmp_path, max_update=4), **QUIET).train(resume=True)


def test_cli_reports_bad_data_folders_and_options(tmp_path, capsys):
    assert cli.main(["train", str(tmp_path), "--save-dir", str(tmp_path / "c")]) == 2
    assert "data prepare" in capsys.readouterr().err
    assert cli.main(["train", str(tmp_path), "--save-dir", str(tmp_path / "c"), "--model-option", "nonsense=1"]) == 2
    assert "unknown model options ['nonsense']" in capsys.readouterr().err


def test_decay_minutes_take_the_lr_linearly_to_zero_over_the_end_of_max_time(copy_data, tmp_path, capsys):
    t = Trainer(tiny_config(copy_data, tmp_path, lr=0.2, max_time_minutes=10, decay_minutes=4), **QUIET)
    for minutes, lr in [(0, 0.2), (6, 0.2), (7, 0.15), (9, 0.05), (10, 0.0), (12, 0.0)]:
        t.progress.train_seconds = minutes * 60
        assert t.current_lr() == pytest.approx(lr)
    t.progress.lr = 0.02  # after a plateau the decay scales the annealed lr
    t.progress.train_seconds = 8 * 60
    assert t.current_lr() == pytest.approx(0.01)
    t._apply_lr()
    assert [g["lr"] for g in t.optimizer.param_groups] == [pytest.approx(0.01)] * len(t.optimizer.param_groups)
    assert Trainer(tiny_config(copy_data, tmp_path / "b", lr=0.2, max_time_minutes=10), **QUIET).current_lr() == 0.2
    assert cli.main(["train", copy_data, "--save-dir", str(tmp_path / "c"), "--decay-minutes", "5"]) == 2
    assert "--decay-minutes 5 needs a --max-time" in capsys.readouterr().err
    with pytest.raises(convs2s.errors.Convs2sError, match="--decay-minutes 5 needs a --max-time"):
        tiny_config(copy_data, tmp_path / "d", max_time_minutes=4, decay_minutes=5)  # the API refuses it too


def test_precision_auto_takes_bf16_only_where_it_was_measured_faster(monkeypatch, tmp_path):
    """``--precision auto``: bf16 autocast only where the conv+GLU forward+backward was measured
    faster in it, whatever the flags say (AVX512-BF16 present and bf16 slower: fp32; flags absent
    and bf16 faster: bf16); ``bf16`` is honoured, and says it is emulated where no flag has it;
    bad values are one-line errors."""
    from convs2s.errors import Convs2sError
    from convs2s.train import bf16_autocast
    import convs2s_kernels.env as env

    monkeypatch.setenv("CONVS2S_TUNE_CACHE", str(tmp_path))
    monkeypatch.delenv("CONVS2S_PRECISION", raising=False)
    cpu = torch.device("cpu")
    monkeypatch.setattr(env, "cpu_flags", lambda: ["avx2", "fma", "avx512f", "avx512_bf16"])
    half_rate = lambda *a: {"fp32": [1.0], "bf16": [2.0]}  # noqa: E731  (the Xeon of issue 48)
    bf16, why = bf16_autocast("auto", cpu, tokens=1000, measure=half_rate)
    assert bf16 is False and why.startswith("fp32 (--precision auto: measured fp32 1000.0 ms, bf16 2000.0 ms")
    monkeypatch.setattr(env, "cpu_flags", lambda: ["avx2", "fma"])
    twice_as_fast = lambda *a: {"fp32": [2.0], "bf16": [1.0]}  # noqa: E731
    assert bf16_autocast("auto", cpu, tokens=2000, measure=twice_as_fast)[0] is True
    bf16, why = bf16_autocast("bf16", cpu)
    assert bf16 and "WITHOUT native bf16" in why
    assert bf16_autocast("fp32", cpu) == (False, "fp32")
    with pytest.raises(Convs2sError, match="precision must be fp32, bf16 or auto"):
        bf16_autocast("fp8", cpu)


def test_cli_precision_auto_trains_in_the_measured_choice_and_reads_it_from_the_cache(copy_data, tmp_path,
                                                                                   monkeypatch, capsys):
    """``convs2s train --precision auto`` measures a conv+GLU layer of the architecture's decoder
    width at --max-tokens once, trains in the winner, and the next run reads the cache."""
    from convs2s import compute_type

    monkeypatch.setenv("CONVS2S_TUNE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("CONVS2S_TUNE", "1")
    monkeypatch.delenv("CONVS2S_PRECISION", raising=False)
    measured = []

    def fake(channels, kernel, tokens, device, backend):
        measured.append((channels, kernel, tokens))
        return {"fp32": [2.0], "bf16": [1.0]}

    monkeypatch.setattr(compute_type, "measure_training", fake)
    opts = [f"--model-option={k}={v}" for k, v in TINY.items() if k != "dropout"]
    for run in ("a", "b"):
        assert cli.main(["train", copy_data, "--save-dir", str(tmp_path / run), "--arch", "fconv", "--max-tokens",
                         "300", "--max-update", "1", "--threads", "1", "--precision", "auto", *opts]) == 0
        err = capsys.readouterr().err
        assert "precision: bf16 autocast (--precision auto: measured fp32 2000.0 ms, bf16 1000.0 ms" in err
        assert read_checkpoint(tmp_path / run / "checkpoint_last.pt")[TRAIN_STATE_KEY]["config"]["bf16"] is True
    assert measured == [(64, 3, 300)]  # once: the second run read the cache


def test_cli_bf16_flag_is_precision_bf16():
    args = cli.build_parser().parse_args(["train", "data", "--save-dir", "x", "--bf16"])
    assert args.precision == "bf16"
    assert cli.build_parser().parse_args(["train", "data", "--save-dir", "x"]).precision == "fp32"


def test_keep_last_epochs_then_average_is_the_mean_of_their_parameters(copy_data, tmp_path):
    from convs2s.average import average_checkpoints, last_epoch_checkpoints

    save = tmp_path / "ckpt"
    Trainer(tiny_config(copy_data, save, max_epoch=4, keep_last_epochs=2), **QUIET).train()
    assert sorted(p.name for p in save.glob("checkpoint[0-9]*.pt")) == ["checkpoint3.pt", "checkpoint4.pt"]
    paths = last_epoch_checkpoints(save, 2)
    states = [read_checkpoint(p)["model"] for p in paths]
    assert any(not torch.equal(states[0][k], states[1][k]) for k in states[0])  # two epochs apart
    avg = average_checkpoints(paths)
    assert TRAIN_STATE_KEY not in avg
    for k, v in avg["model"].items():
        torch.testing.assert_close(v, ((states[0][k].double() + states[1][k].double()) / 2).to(v.dtype))
    out = tmp_path / "avg.pt"
    assert cli.main(["average-checkpoints", "--folder", str(save), "--num-epoch-checkpoints", "2",
                     "--output", str(out)]) == 0
    model = convs2s.load_fairseq(out, save)[0]  # generates from the averaged weights
    assert all(torch.equal(p, avg["model"][k]) for k, p in model.state_dict().items() if k in avg["model"])
    with pytest.raises(convs2s.errors.Convs2sError, match="holds 2 epoch checkpoints"):
        last_epoch_checkpoints(save, 3)
