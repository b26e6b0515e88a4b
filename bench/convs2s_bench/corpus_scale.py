"""How translating a corpus scales across processes (``convs2s.corpus`` under torchrun).

    python3 -m convs2s_bench.corpus_scale --sentences 500 --beams 1,5 --dtypes fp32,auto --repeats 3 \\
        --json bench/results/<machine>/corpus-scale.json

On one machine, the same ``convs2s translate`` command, fconv_wmt_en_fr with random weights (a
fairseq checkpoint written here with a word-per-id dictionary), the paper's newstest sentence
lengths (the speed table's sample), each output allowed its source's length plus one:

* ``plain 1x2``: the plain command, one process of two threads;
* ``torchrun 1x2``: the same under torchrun, one process (the coordination's cost, target <= 3%);
* ``torchrun 2x1``: torchrun, two processes of one thread (CTranslate2's inter_threads);

all in chunks of 16 sentences (sorted by length: see ``make_input``), which the processes take as
they are free.

Each configuration first decodes 16 sentences untimed (the kernel choice and the compute type
measured and cached), then rows are interleaved and repeated; each run's rate is the writer's own line (lines/s over the
translation, the model's loading apart) and its whole wall time; every run's output is compared
byte for byte with the first's. The ratios (the coordination's cost, the split) are taken per
repeat from two runs made one after the other, then their median: a shared machine's drift moves
both runs of a pair, where a ratio of medians would take it in. Then the writer's capacity: ``--fake-workers`` processes' worth of
threads on loopback claim chunks and post canned translations (no decoding), so the chunks/s one
writer hands out, collects and writes (journal included) is what it could feed; divided by the
measured per-machine rate, the machines one writer keeps busy.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Dict, List

CONFIGS = {"plain 1x2": (None, 2), "torchrun 1x2": (1, 2), "torchrun 2x1": (2, 1)}
# the ratios read, each from the two runs of one repeat (run next to each other: the machine's drift cancels)
RATIOS = {"coordination: torchrun 1x2 / plain 1x2": ("torchrun 1x2", "plain 1x2"),
          "split: torchrun 2x1 / torchrun 1x2": ("torchrun 2x1", "torchrun 1x2")}
RATE = re.compile(r"translated (\d+) lines in ([0-9.]+) s")


def make_model(folder: Path, vocab: int = 40000, seed: int = 1) -> Path:
    """A random fconv_wmt_en_fr checkpoint with dictionaries of the words ``w<id>``."""
    import torch

    import convs2s
    from convs2s.dictionary import Dictionary

    torch.manual_seed(seed)
    model = convs2s.build_model("fconv_wmt_en_fr", vocab, vocab)
    d = Dictionary()
    for i in range(len(d), vocab):
        d.add_symbol(f"w{i}")
    convs2s.save_fairseq(model, folder / "model.pt", d, d, "en", "fr")
    return folder / "model.pt"


def make_input(path: Path, sentences: int, vocab: int = 40000) -> Path:
    """The speed table's sentence lengths, the first ``sentences`` of its fixed order, as words,
    sorted by length: random weights never say EOS, so a batch decodes to its longest source's
    limit, and sorted chunks keep that near each sentence's own length (the speed table forces it)."""
    from .workload import random_sentences, synthetic_lengths

    lengths = sorted(synthetic_lengths()[:sentences])
    path.write_text("".join(" ".join(f"w{t}" for t in s) + "\n" for s in random_sentences(lengths, vocab, seed=1)))
    return path


def command(config: str, ckpt: Path, src: Path, out: Path, beam: int, dtype: str, chunk: int = 16) -> List[str]:
    procs, threads = CONFIGS[config]
    run = [sys.executable, "-m", "convs2s"] if procs is None else \
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(procs), "-m", "convs2s"]
    return run + ["translate", "--fairseq-checkpoint", str(ckpt), "--input", str(src), "--output", str(out),
                  "--beam", str(beam), "--compute-type", dtype, "--threads", str(threads), "--chunk-size", str(chunk),
                  "--max-len-a", "1", "--max-len-b", "1"]


def timed_run(cmd: List[str]) -> Dict[str, float]:
    t0 = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if done.returncode != 0:
        raise SystemExit(f"failed: {' '.join(cmd)}\n{done.stderr[-3000:]}")
    lines, seconds = RATE.findall(done.stderr)[-1]
    chosen = re.findall(r"compute type: (\w+)", done.stderr)
    return dict(wall_s=wall, translate_s=float(seconds), lines_per_s=int(lines) / float(seconds),
                compute_type=chosen[-1] if chosen else None)


def summary(values: List[float]) -> dict:
    return dict(median=statistics.median(values), min=min(values), max=max(values), runs=values)


def paired_ratios(cell: dict) -> dict:
    """Each ratio of ``RATIOS`` per repeat (lines/s over lines/s), its median and spread."""
    return {name: summary([x / y for x, y in zip(cell[a]["lines_per_s"]["runs"], cell[b]["lines_per_s"]["runs"])])
            for name, (a, b) in RATIOS.items()}


def measure_splits(work: Path, args) -> dict:
    """Every (beam, dtype) cell: the configurations interleaved ``repeats`` times."""
    ckpt, src = make_model(work), make_input(work / "in.txt", args.sentences)
    warm = make_input(work / "warm.txt", 16)
    cells = {}
    for beam, dtype in args.cells:
        warmed = [timed_run(command(config, ckpt, warm, work / "warm.out", beam, dtype)) for config in CONFIGS]
        chosen = warmed[0]["compute_type"]  # untimed: the kernel choice and the compute type cached first
        if dtype == "auto" and chosen in args.dtypes:  # auto is that row here: measured once, said once
            cells[f"beam{beam}-auto"] = dict(same_as=f"beam{beam}-{chosen}")
            print(json.dumps({f"beam{beam}-auto": f"chose {chosen}"}), flush=True)
            continue
        runs: Dict[str, List[dict]] = {c: [] for c in CONFIGS}
        first: Dict[int, bytes] = {}  # by threads a process: bf16's rounding depends on them
        for r in range(args.repeats):
            order = list(CONFIGS) if r % 2 == 0 else list(reversed(CONFIGS))  # ABC CBA: drift cancels
            for config in order:
                out = work / "out.txt"
                runs[config].append(timed_run(command(config, ckpt, src, out, beam, dtype)))
                threads = CONFIGS[config][1]
                assert first.setdefault(threads, out.read_bytes()) == out.read_bytes(), \
                    f"{config}'s output differs from the first run's of {threads} threads a process"
        cell = {c: dict(lines_per_s=summary([x["lines_per_s"] for x in v]), wall_s=summary([x["wall_s"] for x in v]),
                        compute_type=v[0]["compute_type"]) for c, v in runs.items()}
        cells[f"beam{beam}-{dtype}"] = dict(cell, ratios=paired_ratios(cell),
                                            same_output_1_and_2_threads=len(set(first.values())) == 1)
        print(json.dumps({f"beam{beam}-{dtype}": {c: round(v["median"], 3) for c, v in
                                                  [(c, v["lines_per_s"]) for c, v in cell.items()]
                                                  + list(cells[f"beam{beam}-{dtype}"]["ratios"].items())}}), flush=True)
        if args.json:  # each cell kept as it is measured
            Path(args.json).write_text(json.dumps(dict(partial=True, splits=cells), indent=1) + "\n")
    return cells


def canned(lines) -> list:
    """What a worker posts for a chunk, shaped as real translations (text, tokens, scores)."""
    import torch

    from convs2s.translate import Translation

    out = []
    for lineno, text in lines:
        words = text.split()
        tokens = torch.arange(len(words) + 1)
        out.append(Translation(lineno, text, words, [dict(tokens=tokens, score=-1.0, text=text, words=words,
                                                          positional_scores=torch.zeros(len(words) + 1))]))
    return out


def fake_workers(port: int, workers: int, total: int) -> None:
    """``workers`` threads, each its own store client, claiming and posting until no chunk is left."""
    import torch.distributed as dist

    from convs2s.corpus import Mailbox, decode_claims

    def work():
        store = dist.TCPStore("127.0.0.1", port, is_master=False)
        store.add("ready", 1)
        store.wait(["go"])  # the clock starts once every worker is connected
        decode_claims(Mailbox(store), total, canned)

    threads = [threading.Thread(target=work) for _ in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def writer_capacity(work: Path, workers: int, chunks: int, chunk_size: int) -> dict:
    """Chunks and lines a second one writer hands out, takes back in order and writes (journalled)."""
    import torch.distributed as dist

    from convs2s.corpus import FileOutput, Journal, Mailbox, Writer
    from .workload import random_sentences, synthetic_lengths

    lengths = (synthetic_lengths() * (chunks * chunk_size // 6003 + 1))[:chunks * chunk_size]
    lines = [(i + 1, " ".join(f"w{t}" for t in s)) for i, s in enumerate(random_sentences(lengths, 40000, seed=2))]
    pending = [(k, lines[k * chunk_size:(k + 1) * chunk_size]) for k in range(chunks)]
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    out = FileOutput(work / "capacity.txt", Journal.for_output(work / "capacity.txt", dict(bench=1)))
    sink = lambda trs, k: out.write([tr.hypotheses[0]["text"] for tr in trs], k)  # noqa: E731
    fakes = subprocess.Popen([sys.executable, "-m", "convs2s_bench.corpus_scale", "--fake-workers", str(workers),
                              "--port", str(store.port), "--total", str(chunks)])
    writer = Writer(Mailbox(store), pending, sink, window=2 * workers + 2)
    while store.add("ready", 0) < workers:
        time.sleep(0.05)
    store.set("go", "1")
    t0 = time.perf_counter()
    writer.start()
    writer.join()
    seconds = time.perf_counter() - t0
    out.close(finished=True)
    fakes.wait()
    if writer.error is not None:
        raise writer.error
    return dict(workers=workers, chunks=chunks, chunk_size=chunk_size, seconds=seconds,
                chunks_per_s=chunks / seconds, lines_per_s=chunks * chunk_size / seconds)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sentences", type=int, default=500)
    p.add_argument("--beams", default="1,5")
    p.add_argument("--dtypes", default="fp32,auto")
    p.add_argument("--cells", help="beam-dtype pairs to measure instead of every beam and dtype, e.g. 5-fp32,5-auto")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--capacity-workers", type=int, default=64)
    p.add_argument("--capacity-chunks", type=int, default=400)
    p.add_argument("--chunk-size", type=int, default=512)
    p.add_argument("--skip-splits", action="store_true", help="only the writer's capacity")
    p.add_argument("--json")
    p.add_argument("--fake-workers", type=int, help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, help=argparse.SUPPRESS)
    p.add_argument("--total", type=int, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.fake_workers:
        fake_workers(args.port, args.fake_workers, args.total)
        return 0
    args.dtypes = args.dtypes.split(",")
    args.cells = [(int(b), d) for b, d in (c.split("-") for c in args.cells.split(","))] if args.cells else \
        [(int(b), d) for b in args.beams.split(",") for d in args.dtypes]
    result = dict(command=" ".join(["python3 -m convs2s_bench.corpus_scale", *(argv or sys.argv[1:])]),
                  cpu=_cpu(), sentences=args.sentences)
    with tempfile.TemporaryDirectory(prefix="corpus-scale-") as tmp:
        if not args.skip_splits:
            result["splits"] = measure_splits(Path(tmp), args)
        result["writer_capacity"] = writer_capacity(Path(tmp), args.capacity_workers, args.capacity_chunks,
                                                    args.chunk_size)
    print(json.dumps(result["writer_capacity"]))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    return 0


def _cpu() -> str:
    from convs2s_kernels.env import cpu_model

    return f"{cpu_model()}, {os.cpu_count()} cores"


if __name__ == "__main__":
    sys.exit(main())
