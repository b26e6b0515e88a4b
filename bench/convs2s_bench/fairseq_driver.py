"""Times fairseq's own generator on a request from ``convs2s bench vs-fairseq``.

This file runs under the *fairseq* interpreter (a separate venv where fairseq is installed),
never inside convs2s: it imports only fairseq, torch and the standard library.

    FAIRSEQ_PYTHON fairseq_driver.py REQUEST.json RESULT.json

The request names the checkpoint (fairseq dictionaries beside it), the sentences (word ids
without EOS), the batches (lists of sentence indices, equal source length), the forced output
length of each batch, the beam, the thread count and whether to cache the decoder's linearised
convolution weights (fairseq <= 0.10 did; 0.12 rebuilds them at every step). The result holds the
seconds of every batch (wall clock around fairseq's ``inference_step``, after one untimed
warm-up batch) and the n-best lists.
"""

import json
import os
import sys
import time


def quiet():
    """fairseq's INFO logs and warnings off: the caller reports fairseq's last stderr lines on failure."""
    import logging
    import warnings

    logging.basicConfig(level=logging.WARNING)
    for name in ("fairseq", "fairseq.trainer", "fairseq.tasks", "fairseq.models", "fairseq.utils"):
        logging.getLogger(name).setLevel(logging.WARNING)
    warnings.filterwarnings("ignore")


def allocator() -> str:
    """The malloc this process runs on (tcmalloc or jemalloc preloaded, else glibc's)."""
    with open("/proc/self/maps") as f:
        maps = f.read()
    return next((k for k in ("tcmalloc", "jemalloc") if k in maps), "glibc malloc")


def write_result(out: dict, result_path: str) -> None:
    """The result as JSON, written atomically: a killed driver leaves no half a result."""
    tmp = result_path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(out, f)
    os.replace(tmp, result_path)


def _cache_linearized_weights():
    """Keep each LinearizedConvolution's (out, k*in) weight once built, as fairseq <= 0.10 did."""
    from fairseq.modules.linearized_convolution import LinearizedConvolution

    def cached(self):
        if getattr(self, "_linearized_weight", None) is None:
            k = self.kernel_size[0]
            w = self.weight.transpose(2, 1).transpose(1, 0).contiguous()
            self._linearized_weight = w.view(self.out_channels, k * self.in_channels).detach()
        return self._linearized_weight

    LinearizedConvolution._get_linearized_weight = cached


def _load(checkpoint, beam):
    import torch
    from fairseq import checkpoint_utils

    models, cfg, task = checkpoint_utils.load_model_ensemble_and_task(
        [checkpoint], arg_overrides={"data": os.path.dirname(os.path.abspath(checkpoint))})
    model = models[0].eval()
    cfg.generation.beam = beam
    model.prepare_for_inference_(cfg)  # what fairseq-generate does: weight norm folded, BeamableMM
    return torch, model, cfg, task


def _generator(task, model, cfg, beam, forced):
    gen = cfg.generation
    gen.beam, gen.nbest = beam, beam
    gen.max_len_a, gen.max_len_b, gen.min_len = 0, forced, forced  # exactly `forced` tokens, then EOS
    gen.lenpen, gen.unkpen = 1.0, 0.0
    return task.build_generator([model], gen)


def main(request_path, result_path):
    quiet()
    with open(request_path) as f:
        req = json.load(f)
    if req.get("cache_linearized_weight"):
        _cache_linearized_weights()
    torch, model, cfg, task = _load(req["checkpoint"], req["beam"])
    torch.set_num_threads(req["threads"])
    eos = task.source_dictionary.eos()
    toks = [torch.LongTensor(s + [eos]) for s in req["sentences"]]
    dataset = task.build_dataset_for_inference(toks, [t.numel() for t in toks])
    samples = [dataset.collater([dataset[i] for i in idx]) for idx in req["batches"]]
    gens = [_generator(task, model, cfg, req["beam"], f) for f in req["forced"]]
    with torch.no_grad():
        task.inference_step(gens[0], [model], samples[0])  # warm-up, untimed
    seconds, nbest = [], {}
    with torch.no_grad():
        for sample, gen in zip(samples, gens):
            t0 = time.perf_counter()
            hypos = task.inference_step(gen, [model], sample)
            seconds.append(time.perf_counter() - t0)
            for sid, hs in zip(sample["id"].tolist(), hypos):
                nbest[sid] = [dict(tokens=h["tokens"].tolist(), score=float(h["score"])) for h in hs]
    import fairseq

    out = dict(fairseq=getattr(fairseq, "__version__", "?"), torch=torch.__version__, allocator=allocator(),
               threads=torch.get_num_threads(), batch_seconds=seconds,
               nbest=[nbest[i] for i in range(len(req["sentences"]))])
    write_result(out, result_path)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: fairseq_driver.py REQUEST.json RESULT.json")
    main(sys.argv[1], sys.argv[2])
