"""``convs2s bench vs-fairseq``: fairseq's own generator and convs2s side by side, on the same
checkpoint, sentences, batches and forced lengths, with their outputs compared.

fairseq runs in its own interpreter (``--fairseq-python``, a venv where fairseq is installed;
``../shared/peers/setup_fsq_venv.sh`` builds one) through :mod:`convs2s_bench.fairseq_driver`, so it is
never a dependency of this package. Two fairseq systems are timed: fairseq as released (0.12.2
rebuilds every decoder convolution's linearised weight at every step) and fairseq with those
weights cached (its <= 0.10 behaviour, the stronger baseline). Each repeat runs every system once
at every beam, interleaved; each time is the sum of the batches' wall clocks after one untimed
warm-up batch, model loading excluded.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import tempfile
import time
from typing import Dict, List, Optional, Sequence

import torch

from convs2s.errors import Convs2sError

from .workload import TARGET_RATIO, Config, forced_lengths
from convs2s.engine import quantize_decoder_int8, quantize_encoder_int8

SYSTEMS = ("fairseq", "fairseq-cached", "convs2s")


class VsFairseqError(Convs2sError):
    """Bad options, or fairseq failed (the message carries its last error lines)."""


def read_ids(path: str) -> List[List[int]]:
    """Sentences of word ids, one per line (the peer's input format, EOS not included)."""
    try:
        with open(path, encoding="utf-8") as f:
            lines = [line.split() for line in f if line.strip()]
        return [[int(t) for t in line] for line in lines]
    except (OSError, ValueError) as exc:
        raise VsFairseqError(f"cannot read sentence ids from {path}: {exc}") from None


def plan_batches(sentences: Sequence[Sequence[int]], batch_size: int):
    """Equal-length batches as both generators make them, with each batch's forced length."""
    from convs2s.generate import length_batches

    batches = length_batches([len(s) for s in sentences], batch_size)
    return batches, forced_lengths([sentences[b[0]] for b in batches])  # the speed table's rule


def run_driver(python: str, driver: str, request: dict, error=None) -> dict:
    """``driver`` (a file of this package: ``fairseq_driver.py``, ``fairseq_train_driver.py``) run
    by the fairseq interpreter ``python`` on ``request``; returns its result, or raises ``error``
    (default :class:`VsFairseqError`) with fairseq's last error lines."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), driver)
    with tempfile.TemporaryDirectory(prefix="vs-fairseq-") as tmp:
        req, res = os.path.join(tmp, "request.json"), os.path.join(tmp, "result.json")
        with open(req, "w") as f:
            json.dump(request, f)
        proc = subprocess.run([python, path, req, res], capture_output=True, text=True)
        if proc.returncode != 0 or not os.path.exists(res):
            tail = " | ".join(proc.stderr.strip().splitlines()[-3:]) or f"exit code {proc.returncode}"
            raise (error or VsFairseqError)(f"fairseq ({python}) failed: {tail}")
        with open(res) as f:
            return json.load(f)


def run_fairseq(python: str, checkpoint: str, sentences, batches, forced, beam: int, threads: int,
                cached: bool) -> dict:
    """fairseq's generator in its own interpreter; returns the driver's result."""
    return run_driver(python, "fairseq_driver.py", dict(
        checkpoint=os.path.abspath(checkpoint), sentences=sentences, batches=batches, forced=forced, beam=beam,
        threads=threads, cache_linearized_weight=cached))


def run_convs2s(model, sentences, batches, forced, beam: int, config) -> dict:
    """convs2s on the same batches with fairseq's min = max length rule; one untimed warm-up batch."""
    from convs2s.generate import generate

    model.use_backend(config.backend)
    fold = config.decoder == "folded"

    def one(b, f):
        return generate(model, [sentences[i] for i in b], beam=beam, nbest=beam, batch_size=len(b),
                        max_len_a=0.0, max_len_b=f, min_len=f, fold_attention=fold)

    one(batches[0], forced[0])
    seconds, nbest = [], [None] * len(sentences)
    for b, f in zip(batches, forced):
        t0 = time.perf_counter()
        hyps = one(b, f)
        seconds.append(time.perf_counter() - t0)
        for i, h in zip(b, hyps):
            nbest[i] = [dict(tokens=x["tokens"].tolist(), score=float(x["score"])) for x in h]
    return dict(batch_seconds=seconds, nbest=nbest)


def agreement(ours: Sequence, theirs: Sequence) -> dict:
    """Top-1 identical sentences, whole n-best lists identical, and the largest score difference."""
    top1 = sum(a[0]["tokens"] == b[0]["tokens"] for a, b in zip(ours, theirs))
    lists = sum([h["tokens"] for h in a] == [h["tokens"] for h in b] for a, b in zip(ours, theirs))
    diff = max(abs(a[0]["score"] - b[0]["score"]) for a, b in zip(ours, theirs))
    return dict(sentences=len(ours), top1_identical=top1, nbest_identical=lists, max_top1_score_diff=diff)


# convs2s with int8 weights: the system's name, its activations (quantize_decoder_int8), whether
# the encoder is quantised alike (quantize_encoder_int8, always 8-bit weights: 7-bit encoder weights
# cost 0.8 BLEU on a Multi30k model) and the decoder weights' bits (8, or 7: [-63, 63])
QUANTIZED_SYSTEMS = {"convs2s-int8": ("int8", False, 8), "convs2s-int8w": ("float", False, 8),
                     "convs2s-int7": ("int7", False, 8), "convs2s-int8e": ("int8", True, 8),
                     "convs2s-int7e": ("int7", True, 8), "convs2s-w7a7e": ("int7", True, 7)}


def compare(*, fairseq_python: str, checkpoint: str, dicts: Optional[str], input_ids: str,
            beams: Sequence[int] = (1, 5), repeats: int = 1, batch_size: int = 128, config=None,
            int8: bool = False, int8_weights_only: bool = False, int7: bool = False, int8_encoder: bool = False,
            int7_encoder: bool = False, w7a7_encoder: bool = False, log=print) -> dict:
    """Time every system at every beam, ``repeats`` times interleaved; compare their outputs.
    ``int8`` adds convs2s with int8 decoder weights and activations (``convs2s-int8``,
    ``linear_w8a8``), ``int8_weights_only`` with int8 weights and float32 activations
    (``convs2s-int8w``, ``linear_int8``), ``int7`` with int8 weights and 7-bit activations
    (``convs2s-int7``), ``int8_encoder`` / ``int7_encoder`` the same as ``int8`` / ``int7`` with the
    encoder quantised alike (``convs2s-int8e``, ``convs2s-int7e``), ``w7a7_encoder`` as ``int7_encoder``
    with the decoder's weights in 7 bits (``convs2s-w7a7e``); their outputs are compared
    with fairseq's like the others (they are not expected to be identical)."""
    import convs2s

    if not os.path.exists(fairseq_python):
        raise VsFairseqError(f"--fairseq-python {fairseq_python} does not exist (build a fairseq venv with "
                             "../shared/peers/setup_fsq_venv.sh)")
    config = config or Config("cpp" if convs2s_kernels_cpp() else "reference", "folded", "fp32")
    sentences = read_ids(input_ids)
    if not sentences:
        raise VsFairseqError(f"{input_ids} holds no sentences")
    model, src_dict, _ = convs2s.load_fairseq(checkpoint, dicts)
    model.fold_weight_norm().eval()
    bad = [t for s in sentences for t in s if not 4 <= t < len(src_dict)]
    if bad:
        raise VsFairseqError(f"{input_ids}: word ids must lie in [4, {len(src_dict)}), got {bad[0]}")
    batches, forced = plan_batches(sentences, batch_size)
    threads = torch.get_num_threads()
    asked = {"convs2s-int8": int8, "convs2s-int8w": int8_weights_only, "convs2s-int7": int7,
             "convs2s-int8e": int8_encoder, "convs2s-int7e": int7_encoder, "convs2s-w7a7e": w7a7_encoder}
    systems = SYSTEMS + tuple(s for s in QUANTIZED_SYSTEMS if asked[s])
    times: Dict = {(s, b): [] for s in systems for b in beams}
    outputs: Dict = {}
    for rep in range(repeats):
        for beam in beams:
            for system in systems:
                if system.startswith("convs2s"):
                    activations, encoder, weight_bits = QUANTIZED_SYSTEMS.get(system, ("int8", False, 8))
                    quantize_decoder_int8(model, system != "convs2s", activations=activations, weight_bits=weight_bits)
                    quantize_encoder_int8(model, encoder, activations=activations)
                    out = run_convs2s(model, sentences, batches, forced, beam, config)
                    quantize_encoder_int8(quantize_decoder_int8(model, False), False)
                else:
                    out = run_fairseq(fairseq_python, checkpoint, sentences, batches, forced, beam, threads,
                                      cached=system == "fairseq-cached")
                times[(system, beam)].append(sum(out["batch_seconds"]))
                outputs[(system, beam)] = out
                log(f"repeat {rep + 1}/{repeats} beam {beam} {system:<15} {times[(system, beam)][-1]:.2f} s")
    model.use_backend(None)
    return _result(times, outputs, beams, systems, config, sentences, batches, checkpoint, model)


def convs2s_kernels_cpp() -> bool:
    import convs2s_kernels as ck

    return ck.available_backends()["cpp"] is None


def _result(times, outputs, beams, systems, config, sentences, batches, checkpoint, model) -> dict:
    from convs2s_kernels.env import machine_description

    rows = []
    for beam in beams:
        ours = statistics.median(times[("convs2s", beam)])
        for system in systems:
            t = times[(system, beam)]
            row = dict(system=system, beam=beam, seconds=statistics.median(t), seconds_min=min(t),
                       seconds_max=max(t), repeats=len(t), convs2s_speedup=statistics.median(t) / ours)
            if system in QUANTIZED_SYSTEMS:
                row["agreement_with_fairseq"] = agreement(outputs[(system, beam)]["nbest"],
                                                          outputs[("fairseq", beam)]["nbest"])
            elif system != "convs2s":
                row["agreement_with_convs2s"] = agreement(outputs[("convs2s", beam)]["nbest"],
                                                          outputs[(system, beam)]["nbest"])
                row["fairseq_version"] = outputs[(system, beam)]["fairseq"]
                row["allocator"] = outputs[(system, beam)].get("allocator")
            rows.append(row)
    return dict(rows=rows, convs2s_config=config.name, machine=machine_description("cpu"),
                setup=dict(checkpoint=checkpoint, arch=model.cfg.arch, parameters=model.num_parameters(),
                           sentences=len(sentences), batches=len(batches), forced=f"round({TARGET_RATIO} x source)"))


def _caps(machine: dict) -> str:
    caps = machine.get("isa_caps") or {}
    return f" (capped: {', '.join(f'{k}={v}' for k, v in caps.items())})" if caps else ""


def format_result(result: dict) -> str:
    setup, m = result["setup"], result["machine"]
    lines = [f"{setup['arch']} ({setup['parameters']:,} parameters), {setup['sentences']} sentences in "
             f"{setup['batches']} equal-length batches, outputs forced to {setup['forced']} words; "
             f"{m['cpu']}, {m['threads']} threads, {', '.join(m['isa'])}{_caps(m)}; "
             f"convs2s: {result['convs2s_config']} "
             f"on {m['allocator']}; fairseq on "
             f"{next((r.get('allocator') for r in result['rows'] if r.get('allocator')), 'unknown')}.",
             "", "| system | beam | seconds (median) | range | convs2s speedup | top-1 identical | "
                 "n-best identical | max top-1 score diff |", "|---|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        a = r.get("agreement_with_convs2s") or r.get("agreement_with_fairseq")
        agree = (f"{a['top1_identical']}/{a['sentences']} | {a['nbest_identical']}/{a['sentences']} | "
                 f"{a['max_top1_score_diff']:.1e}") if a else "- | - | -"
        lines.append(f"| {r['system']} | {r['beam']} | {r['seconds']:.2f} | {r['seconds_min']:.2f}–"
                     f"{r['seconds_max']:.2f} | {r['convs2s_speedup']:.2f}x | {agree} |")
    return "\n".join(lines)
