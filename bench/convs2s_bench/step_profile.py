"""Where a decoding step's time goes: one step of a model (random weights, folded attention, the
default backend) at a few row counts, its wall time against the machine's own limits measured
in the same run (weight bytes / copy bandwidth, FLOPs / GEMM peak), and its ops' share from
torch.profiler (the C++ kernels record themselves: ``convs2s::few_rows_nk`` / ``few_rows_kn``).
The limits are also sampled beside every timed step (``roofline.LimitSampler``, right before it and
right after it), and each step held against the better of those two ("paired"): on a VM whose
speed changes for seconds at a time, the best-of limits at the start and the steps' median need
not see the same machine. The unpaired bound takes the best limits measured anywhere in the run,
so that a step below it is a miscount: the table is still written, with a '!' line saying so, and
the command exits 2 (as for ops' times above their steps').

    python3 -m convs2s_bench.step_profile --arch fconv_wmt_en_fr --rows 1,12,160 --out profile.md

``--int8``: the decoder's int8 weights and activations (``quantize_decoder_int8``): the bound's
bytes are the int8 weights and their scales, its compute limit the int8 peak (the better of
``torch._int_mm``, the cpp ``linear_w8a8`` at 64 rows and the int8 dot products' register-only
rate: ``roofline.int8_gemm_peak_gops``) instead of the fp32 one. ``--int7``: the same with 7-bit
activations, against the kernel's and the dot products' rates with 7-bit activations;
``--w7a7``: with 7-bit weights too (``weight_bits=7``), against those rates with 7-bit weights.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import List, Optional, Sequence, Tuple

import torch

from convs2s.model import build_model
from convs2s.engine.shapes import step_weight_bytes, step_weight_modules
from convs2s_kernels.env import machine_description

from .report import positive_ints, publish
from .roofline import LimitSampler, copy_peak_gbps, gemm_peak_gflops, int8_gemm_peak_gops
from convs2s.engine import prepare, quantize_decoder_int8

SOURCE_LEN = 27  # the mean newstest source (25.4 subwords) rounded up, as in the peer workload
PROFILED_STEPS = 5  # steps under torch.profiler, timed on their own (the profiler slows them a little)
PROFILED_RANGE = "convs2s_bench::profiled_steps"  # around them: names the thread that ran them


def sentences_and_beam(rows: int) -> Tuple[int, int]:
    """Rows as sentences x beam: beam 5 where it divides, else 4, else 1 (12 rows: 3 x 4)."""
    for beam in (5, 4):
        if rows % beam == 0 and rows > beam:
            return rows // beam, beam
    return rows, 1


def _step_weights(model) -> List[torch.Tensor]:
    """The tensors a step streams per weight: the float weight, or the int8 weight and its scales."""
    out = []
    for m in step_weight_modules(model.decoder):
        derived = prepare(model).derived(m)
        quantized = None if derived is None else derived.int8_weight()
        if quantized is not None:
            out += list(quantized)
        else:
            out.append(m.effective_weight() if hasattr(m, "effective_weight") else m.weight)
    return out


def step_bounds(model, rows: int, src_len: int) -> Tuple[int, float]:
    """(bytes of weights a step streams, FLOPs of a step): every step weight read once, and each
    row's products with them plus its folded attention over the source (scores and weighted
    sum, 2 x S x C FLOPs each)."""
    weight_bytes = step_weight_bytes(prepare(model))
    weights = [w for w in _step_weights(model) if w.dim() >= 2]  # int8 scales: bytes, no products
    flops = 2.0 * rows * sum(w.numel() for w in weights)
    for conv, att in zip(model.decoder.convolutions, model.decoder.attention):
        if att is not None:
            flops += 2.0 * rows * 2 * src_len * conv.out_channels // 2
    return weight_bytes, flops


def _step_fn(model, rows: int, src_len: int):
    sentences, beam = sentences_and_beam(rows)
    src = torch.randint(4, model.src_vocab_size, (sentences, src_len), generator=torch.Generator().manual_seed(rows))
    state = prepare(model).init_decoder_state(prepare(model).encode(src), beam, fold_attention=True)
    tokens = torch.full((rows,), 2, dtype=torch.long)

    def step():
        logits, _ = prepare(model).decode_step(tokens, state)
        return torch.log_softmax(logits.float(), dim=-1)
    return step


def profile_rows(model, rows: int, steps: int = 40, src_len: int = SOURCE_LEN,
                 sampler: Optional[LimitSampler] = None) -> dict:
    """Median step seconds of ``steps`` steps, each between two samples of the machine's limits
    (``sampler``: ``limits``, one (copy GB/s, compute peak) before each step and one after the
    last; an untimed step between a sample and its step
    brings the weights back where they live between steps), and each op's self time per
    step (ms) from 5 profiled steps. 40 steps, not 10: on a 2-vCPU VM whose vCPUs changed speed
    for seconds at a time, the median of 10 fell on either side of the change from run to run."""
    from torch.profiler import ProfilerActivity, profile, record_function

    with torch.no_grad():
        step = _step_fn(model, rows, src_len)
        for _ in range(3):
            step()
        times, limits = [], []
        for _ in range(steps):
            if sampler is not None:
                limits.append(sampler.sample())
                step()  # untimed: the sample's copy evicted the weights of a model that fits in the caches
            t0 = time.perf_counter()
            step()
            times.append(time.perf_counter() - t0)
        if sampler is not None:
            limits.append(sampler.sample())  # right after the last step: each step has one before and after
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            with record_function(PROFILED_RANGE):
                t0 = time.perf_counter()
                for _ in range(PROFILED_STEPS):
                    step()
                profiled_s = (time.perf_counter() - t0) / PROFILED_STEPS
    ops_us = stepping_thread_ops(prof.events())
    return dict(rows=rows, step_s=statistics.median(times), step_range=(min(times), max(times)),
                ops_ms={k: v / 1e3 / PROFILED_STEPS for k, v in ops_us.items()}, profiled_step_s=profiled_s,
                seen=sum(ops_us.values()) / 1e6 / (profiled_s * PROFILED_STEPS), step_times=times, limits=limits)


def stepping_thread_ops(events) -> dict:
    """Microseconds of self time per op name on the thread that ran the profiled steps (the one of
    the PROFILED_RANGE around them, itself left out): children excluded, so nothing counts twice,
    and a worker thread's ops, which overlap the stepping thread's time, left out."""
    outer = next(e for e in events if e.name == PROFILED_RANGE)
    ops: dict = {}
    for e in events:
        if e.thread == outer.thread and e.name != PROFILED_RANGE:
            ops[e.name] = ops.get(e.name, 0.0) + e.self_cpu_time_total
    return ops


def _better(a: Tuple[float, Optional[float]], b: Tuple[float, Optional[float]]) -> Tuple[float, Optional[float]]:
    return max(a[0], b[0]), max((c for c in (a[1], b[1]) if c), default=None)


def paired_bounds(rec: dict) -> Optional[dict]:
    """From a row count's steps and the limits sampled beside each (the better of the sample right
    before a step and the one right after it): the median bound (ms), the median, lowest and
    highest of the per-step ratios step / bound, and how many steps beat their bound (a sample that
    under-measured the machine for a moment); None without samples."""
    limits, times = rec.get("limits", []), rec.get("step_times", [])
    if not limits or not times:
        return None
    around = [_better(before, after) for before, after in zip(limits, limits[1:])]  # step i: samples i, i + 1
    pairs = [(t, max(rec["bytes"] / copy / 1e9, rec["flops"] / compute / 1e9 if compute else 0.0))
             for t, (copy, compute) in zip(times, around)]
    ratios = [t / b for t, b in pairs]
    return dict(bound_ms=statistics.median(b for _, b in pairs) * 1e3, ratio=statistics.median(ratios),
                ratio_range=(min(ratios), max(ratios)), below_one=sum(r < 1 for r in ratios), steps=len(ratios))


def best_limits(result: dict) -> Tuple[float, float]:
    """The best copy bandwidth and compute rate measured anywhere in the run: the best-of at its
    start and every sample beside a step. The unpaired bound uses these, so that a step below it
    is a miscount, never a slow sample."""
    compute = result["int8_gops"] if result.get("int8") else result["gemm_gflops"]
    copies, computes = [result["copy_gbps"]], [compute]
    for r in result["rows"]:
        for copy, rate in r.get("limits", []):
            copies.append(copy)
            computes.append(rate or 0.0)
    return max(copies), max(computes)


def _bound_ms(row: dict, copy_gbps: float, compute: float) -> float:
    return max(row["bytes"] / copy_gbps / 1e6, row["flops"] / compute / 1e6)


def miscounts(result: dict) -> List[str]:
    """What in the profile cannot be a measurement: a median step below the bound of the best limits
    measured in its run (the bytes or FLOPs are miscounted), or ops longer than the steps they ran in."""
    best_copy, best_compute = best_limits(result)
    out = []
    for r in result["rows"]:
        step_ms, bound_ms = r["step_s"] * 1e3, _bound_ms(r, best_copy, best_compute)
        if step_ms < bound_ms:
            out.append(f"{r['rows']} rows: the median step ({step_ms:.2f} ms) beat the bound of the best limits "
                       f"measured in the run ({bound_ms:.2f} ms): the bytes or FLOPs are miscounted")
        if r["seen"] > 1.0:
            out.append(f"{r['rows']} rows: the stepping thread's ops took {100 * r['seen']:.0f}% of the profiled "
                       "steps' wall time: their times are miscounted")
    return out


def format_profile(result: dict, top: int = 8) -> str:
    m = result["machine"]
    best_copy, best_compute = best_limits(result)
    seven = result.get("activation_bits") == 7
    weights = "7-bit" if result.get("weight_bits") == 7 else "int8"
    dtype = (f"{weights} decoder weights and 7-bit activations" if seven else "int8 decoder weights and activations"
             ) if result.get("int8") else "fp32"
    peak = (f"int8 {result['int8_gops']:.0f} GOP/s (the best of torch._int_mm, the cpp linear_w8a8 at 64 rows and the int8 dot products' register-only rate)" if result.get("int8")
            else f"fp32 peak {result['gemm_gflops']:.0f} GFLOP/s (the better of ATen's GEMM and the FMA units' "
                 "register-only rate)")
    lines = [f"Decoding-step profile, {result['arch']} (random weights, folded attention, backend auto, {dtype}), "
             f"source length {result['src_len']}; {m['cpu']}, {m['threads']} threads, "
             f"ISA {', '.join(m['isa'])}" + (f" (capped: {m['isa_caps']})" if m['isa_caps'] else "") +
             f"; kernels {result['kernels_isa']}.",
             f"Limits measured in this run, best of 5 at its start: copy {result['copy_gbps']:.1f} GB/s (a copy "
             f"touching the step's {result.get('weight_mb', 0):.0f} MB of weights), {peak}. "
             f"Bound = max(weight bytes / copy bandwidth, FLOPs / compute peak), with the best limits measured "
             f"anywhere in the run (those, or any sample below): copy {best_copy:.1f} GB/s, compute {best_compute:.0f}. "
             "'paired': the limits sampled again beside every timed step (a copy, a sum and a prefetching read "
             "over the same bytes; "
             + ("the better of the int8 dot products' register-only rate and the int8 kernel at 64 rows" if result.get("int8") else "the FMA units' rate") +
             "; the better of the sample right before the step and the one right after it), each step held "
             "against its own bound; the median of those ratios (lowest-highest).", "",
             f"'seen': the share of {PROFILED_STEPS} steps run under torch.profiler (timed on their own) that the "
             "stepping thread spent inside ops it sees (kernels built without RECORD_FUNCTION labels are "
             "invisible to it and fall outside); the top ops' ms and % are per profiled step.", "",
             "| rows | step ms (median, range) | bound ms | step / bound | paired bound ms | paired step / bound "
             "| seen | top ops: ms per step (% of step) |",
             "|---|---|---|---|---|---|---|---|"]
    notes = [f"! {problem}" for problem in miscounts(result)]
    for r in result["rows"]:
        step_ms = r["step_s"] * 1e3
        bound_ms = _bound_ms(r, best_copy, best_compute)
        profiled_ms = r["profiled_step_s"] * 1e3
        ranked = sorted(r["ops_ms"].items(), key=lambda kv: -kv[1])[:top]
        ops = "; ".join(f"{k} {v:.2f} ({100 * v / profiled_ms:.0f}%)" for k, v in ranked)
        paired = paired_bounds(r)
        paired_cells = (f"{paired['bound_ms']:.2f} | {paired['ratio']:.2f}x ({paired['ratio_range'][0]:.2f}-"
                        f"{paired['ratio_range'][1]:.2f})" if paired else "- | -")
        if paired and paired["below_one"]:
            notes.append(f"{r['rows']} rows: {paired['below_one']} of {paired['steps']} steps beat both limit "
                         "samples beside them (those samples under-measured the machine for a moment).")
        lines.append(f"| {r['rows']} | {step_ms:.2f} ({r['step_range'][0] * 1e3:.2f}-{r['step_range'][1] * 1e3:.2f}) | "
                     f"{bound_ms:.2f} | {step_ms / bound_ms:.2f}x | {paired_cells} | "
                     f"{100 * r['seen']:.0f}% | {ops} |")
    return "\n".join(lines + ([""] + notes if notes else []))


def run(arch: str, rows: Sequence[int], src_len: int = SOURCE_LEN, vocab: int = 40000, int8: bool = False,
        activation_bits: int = 8, weight_bits: int = 8) -> dict:
    from convs2s_kernels.extension import int8_kernel_isa, small_gemm_isa

    torch.manual_seed(0)
    model = build_model(arch, vocab, vocab).fold_weight_norm().eval()
    quantize_decoder_int8(model, int8, activations="int7" if activation_bits == 7 else "int8", weight_bits=weight_bits)
    weight_bytes, _ = step_bounds(model, 1, src_len)
    # a copy touching as many bytes as the step's weights (source + destination): memory's bandwidth
    # for a big model, the caches' for one that fits in them (a step re-reads the same weights)
    result = dict(arch=arch, src_len=src_len, machine=machine_description(),
                  kernels_isa=int8_kernel_isa() if int8 else small_gemm_isa(), int8=int8, activation_bits=activation_bits,
                  weight_bits=weight_bits,
                  copy_gbps=copy_peak_gbps(megabytes=max(1, weight_bytes // 2 // (1 << 20))),
                  gemm_gflops=gemm_peak_gflops(), weight_mb=weight_bytes / 1e6, rows=[])
    if int8:
        result["int8_gops"] = int8_gemm_peak_gops(activation_bits=activation_bits, weight_bits=weight_bits)
    sampler = LimitSampler(max(1, weight_bytes // 2 // (1 << 20)), int8=int8,
                           fallback_compute=result.get("int8_gops") if int8 else result["gemm_gflops"],
                           activation_bits=activation_bits, weight_bits=weight_bits)
    for r in rows:
        rec = profile_rows(model, r, src_len=src_len, sampler=sampler)
        rec["bytes"], rec["flops"] = step_bounds(model, r, src_len)
        result["rows"].append(rec)
    return result


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python3 -m convs2s_bench.step_profile", description=__doc__.split("\n\n")[0])
    p.add_argument("--arch", default="fconv_wmt_en_fr")
    p.add_argument("--rows", default="1,12,160", help="comma-separated row counts (sentences x beam)")
    p.add_argument("--int8", action="store_true", help="int8 decoder weights and activations (quantize_decoder_int8)")
    p.add_argument("--int7", action="store_true", help="int8 decoder weights and 7-bit activations (the limits too)")
    p.add_argument("--w7a7", action="store_true", help="7-bit decoder weights and activations (the limits too)")
    p.add_argument("--out", help="also write the table to this markdown file")
    args = p.parse_args(argv)
    rows = positive_ints(p, "--rows", args.rows)
    seven = args.int7 or args.w7a7
    result = run(args.arch, rows, int8=args.int8 or seven, activation_bits=7 if seven else 8,
                 weight_bits=7 if args.w7a7 else 8)
    publish(format_profile(result), args.out)  # kept even when refused below: the timings stand
    wrong = miscounts(result)
    if wrong:
        print(f"error: the profile is refused ('!' under its table): {'; '.join(wrong)}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
