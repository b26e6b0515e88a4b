"""Times fairseq's own training updates on a request from ``convs2s bench vs-fairseq --train``.

This file runs under the *fairseq* interpreter (a separate venv where fairseq is installed),
never inside convs2s: it imports only fairseq, torch, the standard library and its sibling
``fairseq_driver.py`` (the helpers both drivers share).

    FAIRSEQ_PYTHON fairseq_train_driver.py REQUEST.json RESULT.json

The request names a folder holding the initial weights (``model.pt``, a fairseq fconv checkpoint
written by ``convs2s.save_fairseq``) and the dictionaries, the architecture and the training
settings, the examples (source and target ids, EOS included) and the batches (lists of example
indices). fairseq is set up as ``fairseq-train`` sets itself up (its command line parsed into its
config, the translation task, ``task.build_model``, the ``label_smoothed_cross_entropy``
criterion, the ``nag`` optimizer, ``fairseq.trainer.Trainer``); the model's weights are then
replaced by the initial ones. Each update is ``Trainer.train_step`` on one batch: forward,
backward, gradients divided by the target tokens, clipped to ``clip_norm``, the NAG step. The
result holds the seconds of the timed pass over the batches (after ``warmup`` untimed updates)
and each update's loss per target token and gradient norm.

With ``compile`` (a ``torch.compile`` mode: ``default``, ``max-autotune-no-cudagraphs``, ...) the
model is compiled in place first (``nn.Module.compile``, with ``compile_backend``, inductor by
default), as a user would try: the untimed updates then hold the compilation (``warmup_seconds``)
and the result counts the graphs dynamo made and its graph breaks. A compiled model that fails
is a result, not a crash: ``error`` holds the exception in one line.
"""

import json
import os
import sys
import time

try:  # imported within convs2s_bench, or run as a script with fairseq_driver.py beside it on sys.path
    from .fairseq_driver import allocator, quiet, write_result
except ImportError:
    from fairseq_driver import allocator, quiet, write_result


def _setup(req):
    import torch
    from fairseq import options, tasks, utils
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    from fairseq.trainer import Trainer

    argv = [req["folder"], "--task", "translation", "--source-lang", req["source_lang"],
            "--target-lang", req["target_lang"], "--arch", req["arch"], "--dropout", str(req["dropout"]),
            "--optimizer", "nag", "--lr", str(req["lr"]), "--momentum", str(req["momentum"]),
            "--clip-norm", str(req["clip_norm"]), "--lr-scheduler", "fixed",
            "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", str(req["label_smoothing"]),
            "--max-tokens", str(req["max_tokens"]), "--seed", str(req["seed"]), "--cpu", "--no-progress-bar",
            "--save-dir", req["folder"], "--no-save"]
    args = options.parse_args_and_arch(options.get_training_parser(), argv)
    cfg = convert_namespace_to_omegaconf(args)
    utils.set_torch_seed(cfg.common.seed)
    task = tasks.setup_task(cfg.task)
    model = task.build_model(cfg.model)
    state = torch.load(os.path.join(req["folder"], "model.pt"), map_location="cpu", weights_only=False)["model"]
    model.load_state_dict(state, strict=True)
    criterion = task.build_criterion(cfg.criterion)
    return torch, task, Trainer(cfg, task, model, criterion)


def _samples(torch, task, req):
    from fairseq.data import LanguagePairDataset

    src = [torch.LongTensor(s) for s in req["sources"]]
    tgt = [torch.LongTensor(t) for t in req["targets"]]
    dataset = LanguagePairDataset(src, [len(s) for s in src], task.source_dictionary, tgt, [len(t) for t in tgt],
                                  task.target_dictionary, left_pad_source=True, left_pad_target=False)
    return [dataset.collater([dataset[i] for i in idx]) for idx in req["batches"]]


def failure_line(exc: BaseException) -> str:
    """``exc`` in one line: its type and the first line of its message that says something (the
    traceback's last line, without the hints inductor appends such as 'Set TORCHDYNAMO_VERBOSE=1')."""
    lines = [line.strip() for line in str(exc).splitlines()
             if line.strip() and not line.strip().startswith(("Set TORCHDYNAMO_VERBOSE", "For more details"))]
    if len(lines) > 1 and lines[0].endswith(":"):  # dynamo's "backend='inductor' raised:", then what it raised
        lines[0] = f"{lines[0]} {lines[1]}"
    text = f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__
    return text if len(text) <= 300 else text[:297] + "..."


def dynamo_counts() -> dict:
    """The graphs dynamo has compiled in this process, its graph breaks, and their reasons (first
    line each, with how often)."""
    from torch._dynamo.utils import counters

    reasons = {}
    for reason, n in counters["graph_break"].items():
        first = str(reason).strip().splitlines()[0] if str(reason).strip() else "?"
        reasons[first] = reasons.get(first, 0) + n
    return dict(graphs=counters["stats"]["unique_graphs"], graph_breaks=sum(reasons.values()), reasons=reasons)


def counted_since(before: dict, after: dict) -> dict:
    """What dynamo compiled and broke on between two :func:`dynamo_counts`."""
    reasons = {k: n - before["reasons"].get(k, 0) for k, n in after["reasons"].items()}
    return dict(graphs=after["graphs"] - before["graphs"], graph_breaks=after["graph_breaks"] - before["graph_breaks"],
                break_reasons={k: n for k, n in reasons.items() if n > 0})


def _recorders(task, trainer):
    """Each update's loss per target token and gradient norm, recorded as fairseq computes them."""
    losses, gnorms = [], []
    step, clip = task.train_step, trainer.clip_grad_norm

    def recording_step(sample, model, criterion, optimizer, update_num, ignore_grad=False):
        loss, sample_size, logging_output = step(sample, model, criterion, optimizer, update_num, ignore_grad)
        losses.append(float(logging_output["loss"]) / float(logging_output["ntokens"]))
        return loss, sample_size, logging_output

    def recording_clip(clip_norm):
        norm = clip(clip_norm)
        gnorms.append(float(norm))
        return norm

    task.train_step, trainer.clip_grad_norm = recording_step, recording_clip
    return losses, gnorms


def _updates(trainer, samples, req) -> dict:
    """``warmup`` untimed updates (the compilation, when compiled), then the timed pass."""
    mode = req.get("compile")
    if mode:
        import torch._dynamo

        torch._dynamo.config.automatic_dynamic_local_pgo = False  # independent of earlier runs' profiles
        trainer.model.compile(backend=req.get("compile_backend") or "inductor",
                              **({} if mode == "default" else {"mode": mode}))
    before = dynamo_counts()
    t0 = time.perf_counter()
    first = None
    for i in range(req["warmup"]):  # untimed: the optimizer is built, buffers allocated
        trainer.train_step([samples[i % len(samples)]])
        first = time.perf_counter() - t0 if first is None else first
    warm = time.perf_counter() - t0
    compiled = dynamo_counts()
    t0 = time.perf_counter()
    for sample in samples:
        trainer.train_step([sample])
    seconds = time.perf_counter() - t0
    out = dict(seconds=seconds, warmup_seconds=warm, first_update_seconds=first)
    if mode:  # what compiling made (without untimed updates: the whole run), and what the timed pass added
        end = dynamo_counts()
        out.update(counted_since(before, compiled if req["warmup"] else end),
                   graphs_in_timed_pass=counted_since(compiled, end)["graphs"])
    return out


def main(request_path, result_path):
    quiet()
    with open(request_path) as f:
        req = json.load(f)
    torch, task, trainer = _setup(req)
    torch.set_num_threads(req["threads"])
    samples = _samples(torch, task, req)
    losses, gnorms = _recorders(task, trainer)
    import fairseq

    out = dict(fairseq=getattr(fairseq, "__version__", "?"), torch=torch.__version__, threads=torch.get_num_threads(),
               allocator=allocator(), warmup=req["warmup"], compile=req.get("compile"),
               parameters=sum(p.numel() for p in trainer.model.parameters()))
    try:
        out.update(_updates(trainer, samples, req))
    except Exception as exc:  # noqa: BLE001  (a compiled model's failure is the row's result)
        if not req.get("compile"):
            raise
        out.update(error=failure_line(exc), seconds=None)
    out.update(losses=losses, gnorms=gnorms)
    write_result(out, result_path)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: fairseq_train_driver.py REQUEST.json RESULT.json")
    main(sys.argv[1], sys.argv[2])
