"""Where one CUDA decode of a full batch spends its time, with and without the step's CUDA graph.

Run on a GPU machine from the repository root (``PYTHONPATH=.:bench``):
``python3 bench/tools/gpu_batch_profile.py [--backend triton] [--out DIR]``. It decodes 128 random
sentences of 25 subwords at beam 5 with 28 forced target subwords (the full set's largest batch
shape) with fconv_wmt_en_fr in bf16, prints the batch's wall time and the mean spacing of the step hooks,
and writes a ``torch.profiler`` table per mode (CUDA time, then self CPU time) to ``DIR``, with the
GPU's busy share of the profiled batch (the union of its kernels' and copies' intervals over the
wall time) and its kernels a step as the profiler counts them (beside the 46 counted on the CPU).
"""

from __future__ import annotations

import argparse
import os
import time

import torch
from torch.profiler import ProfilerActivity, profile

import convs2s


def time_batch(model, sources, graph: bool, **kw) -> str:
    stamps = []
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    hooks = convs2s.Observer(forced_length=[28] * len(sources), cuda_graph=graph,
                             on_step=lambda _: stamps.append(time.perf_counter()))
    convs2s.generate(model, sources, observer=hooks, **kw)
    torch.cuda.synchronize()
    t1 = time.perf_counter()
    # a replay of several steps calls their hooks together: the mean spacing is the step's cost
    mean = (stamps[-1] - stamps[0]) / max(len(stamps) - 1, 1)
    return (f"cuda_graph={graph}: batch {1e3 * (t1 - t0):.1f} ms, {len(stamps)} step hooks, "
            f"{1e3 * mean:.2f} ms a step between the first and the last hook, "
            f"{1e3 * (t1 - stamps[-1]):.1f} ms from the last hook to the end")


def device_summary(events, wall_us: float, steps: int, device_type=None) -> str:
    """The device's busy share of ``wall_us`` (its events' intervals merged: overlaps counted once)
    and its kernel launches a step (memory copies and sets apart)."""
    from torch.autograd import DeviceType

    device_type = DeviceType.CUDA if device_type is None else device_type
    mine = [e for e in events if e.device_type == device_type]
    spans = sorted((e.time_range.start, e.time_range.end) for e in mine)
    busy, reach = 0.0, float("-inf")
    for start, end in spans:
        busy += max(0.0, end - max(start, reach))
        reach = max(reach, end)
    kernels = [e for e in mine if not any(k in e.name.lower() for k in ("memcpy", "memset"))]
    return (f"device busy {busy / 1e3:.1f} ms of {wall_us / 1e3:.1f} ms ({100 * busy / max(wall_us, 1e-9):.0f}%); "
            f"{len(kernels)} kernels and {len(mine) - len(kernels)} copies/sets in {steps} steps: "
            f"{len(kernels) / max(steps, 1):.1f} kernels a step")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="triton")
    parser.add_argument("--out", default=os.environ.get("OUT", "."))
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("gpu_batch_profile: no CUDA device here")
    torch.manual_seed(0)
    model = convs2s.build_model("fconv_wmt_en_fr", 40000, 40000).eval().to("cuda", torch.bfloat16)
    model.use_backend(args.backend)
    sources = torch.randint(10, 40000, (128, 25)).tolist()
    kw = dict(beam=5, fold_attention=True)
    for graph in (True, False):
        hooks = convs2s.Observer(forced_length=[28] * 128, cuda_graph=graph)
        for _ in range(2):  # tune, compile, record
            convs2s.generate(model, sources, observer=hooks, **kw)
        print(time_batch(model, sources, graph, **kw), flush=True)
        steps = []
        counted = convs2s.Observer(forced_length=[28] * 128, cuda_graph=graph, on_step=steps.append)
        convs2s.generate(model, sources, observer=counted, **kw)  # the hooked observer's own recording
        steps.clear()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            t0 = time.perf_counter()
            convs2s.generate(model, sources, observer=counted, **kw)
            torch.cuda.synchronize()
            wall_us = 1e6 * (time.perf_counter() - t0)
        table = prof.key_averages()
        path = os.path.join(args.out, f"profile-batch128-beam5-{'graph' if graph else 'eager'}.txt")
        with open(path, "w") as f:
            f.write(table.table(sort_by="cuda_time_total", row_limit=40) + "\n\n")
            f.write(table.table(sort_by="self_cpu_time_total", row_limit=30))
            try:  # the tables are kept whatever this says
                line = f"cuda_graph={graph}: " + device_summary(prof.events(), wall_us, len(steps))
            except Exception as exc:  # noqa: BLE001
                line = f"cuda_graph={graph}: no device summary ({type(exc).__name__}: {exc})"
            f.write("\n\n" + line + "\n")
        print(line, flush=True)
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
