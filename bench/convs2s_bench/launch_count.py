"""How many kernels a decoding step would launch on a GPU, counted on the CPU (issue 50).

A step is run eagerly on the CPU with the backend the GPU would use (``triton,reference``: the
Triton kernels in their interpreter, everything else ATen), under a ``TorchDispatchMode`` that
sees every ATen operation and a wrapper around Triton's launcher that sees every Triton launch.
Each ATen operation is sorted by what it would cost on CUDA:

* ``kernel`` — launches a kernel (arithmetic, reductions, fills, gathers, top-k...);
* ``copy`` — a kernel that only moves data (``copy_``, ``clone``, ``_to_copy``): the issue wants
  none inside a step;
* ``alloc`` — an allocation without a kernel (``empty``...): none inside a step either;
* ``view`` — metadata only (views, sizes, ``detach``): free, not counted as launches.

Launches are attributed to the step (``Observer.on_step``) and to the component, the
innermost function of the ``convs2s`` package on the Python stack (e.g. ``step.decode_step``,
``generate._beam_search``); Triton launches to their kernel's name.

    python3 -m convs2s_bench.launch_count --arch fconv_wmt_en_fr --beam 5 --sentences 2
"""

from __future__ import annotations

import argparse
import os
import sys
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Tuple

import torch
from torch.utils._python_dispatch import TorchDispatchMode

aten = torch.ops.aten
PACKAGE = str(Path(__import__("convs2s").__file__).resolve().parent) + os.sep  # the model package, not the kernels
_METADATA = {aten.sym_size.int, aten.sym_stride.int, aten.sym_numel.default, aten.sym_storage_offset.default,
             aten.detach.default, aten.lift_fresh.default, aten.size.int, aten.stride.int,
             aten.is_same_size.default, aten.result_type.Tensor, aten.result_type.Scalar}
_ALLOCS = {aten.empty.memory_format, aten.empty_strided.default, aten.empty_like.default, aten.new_empty.default,
           aten.new_empty_strided.default}
_COPIES = {aten.copy_.default, aten.clone.default, aten._to_copy.default}


def kind(func) -> str:
    """What an ATen operation costs on CUDA: kernel, copy, alloc or view (see the module's docstring)."""
    if func.is_view or func in _METADATA or func is aten._unsafe_view.default:
        return "view"
    if func in _ALLOCS:
        return "alloc"
    if func in _COPIES:
        return "copy"
    return "kernel"


def component() -> str:
    """The innermost ``convs2s`` function on the stack, as ``module.function``."""
    frame = sys._getframe(2)
    while frame is not None:
        path = frame.f_code.co_filename
        if path.startswith(PACKAGE):
            return f"{Path(path).stem}.{frame.f_code.co_name}"
        frame = frame.f_back
    return "?"


@dataclass
class Counts:
    """Every launch seen: ``records[step]`` is a Counter of ``(component, kind, op)``."""

    records: Dict[int, Counter] = field(default_factory=dict)
    step: int = -2  # -2: before the batch is encoded; -1: encoding and state; 0..: decoding steps
    in_triton: int = 0  # inside a Triton launch: the interpreter's own tensor work is not the GPU's

    def add(self, where: str, what: str, op: str) -> None:
        if self.in_triton and what != "triton":
            return
        self.records.setdefault(self.step, Counter())[(where, what, op)] += 1

    def per_step(self, what: str = "launches") -> Dict[int, int]:
        """Launches (kernels, copies and Triton launches) or one kind per step."""
        want = ("kernel", "copy", "triton") if what == "launches" else (what,)
        return {s: sum(n for (_, k, _), n in c.items() if k in want) for s, c in sorted(self.records.items())}


class _Seen(TorchDispatchMode):
    def __init__(self, counts: Counts):
        super().__init__()
        self.counts = counts

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.counts.add(component(), kind(func), str(func.overloadpacket.__name__))
        return func(*args, **(kwargs or {}))


@contextmanager
def _triton_launches(counts: Counts) -> Iterator[None]:
    """Count every Triton launch (compiled or interpreted) as one ``triton`` launch of its kernel."""
    try:
        from triton.runtime import interpreter, jit
    except ImportError:
        yield
        return
    classes = [jit.JITFunction, interpreter.InterpretedFunction]
    originals = [c.run for c in classes]

    def counted(original):
        def run(self, *args, **kwargs):
            counts.add(component(), "triton", getattr(getattr(self, "fn", None), "__name__", type(self).__name__))
            counts.in_triton += 1
            try:
                return original(self, *args, **kwargs)
            finally:
                counts.in_triton -= 1
        return run

    for c, original in zip(classes, originals):
        c.run = counted(original)
    try:
        yield
    finally:
        for c, original in zip(classes, originals):
            c.run = original


@contextmanager
def _unpoisoned() -> Iterator[None]:
    """The kernels' output buffers as decoding allocates them (``torch.empty``), not NaN-filled as
    the tests ask (``CONVS2S_KERNELS_POISON``): a fill would count as a kernel the GPU never runs."""
    from convs2s_kernels.triton_common.config import POISON_ENV

    before = os.environ.pop(POISON_ENV, None)
    try:
        yield
    finally:
        if before is not None:
            os.environ[POISON_ENV] = before


def count_generation(model, sources: List[List[int]], *, beam: int, steps: int, fold_attention: bool = True,
                     backend: str = "triton,reference") -> Counts:
    """The launches of an eager ``generate`` of ``sources`` forced to ``steps`` output tokens, per step."""
    import convs2s

    counts = Counts()

    def hook(step: int) -> None:
        counts.step = step + 1  # what follows belongs to the next step

    model.use_backend(backend)
    try:
        with _unpoisoned(), _triton_launches(counts), _Seen(counts):
            hooks = convs2s.Observer(forced_length=[steps] * len(sources), on_step=hook, cuda_graph=False)
            convs2s.generate(model, sources, beam=beam, batch_size=len(sources), max_len_b=steps + 2,
                             fold_attention=fold_attention, observer=hooks)
    finally:
        model.use_backend(None)
    return counts


def steady_step(counts: Counts) -> Tuple[int, Counter]:
    """A step in the middle of the decoding (not the first, not the last): its number and records."""
    steps = [s for s in counts.records if s >= 1]
    s = steps[len(steps) // 2]
    return s, counts.records[s]


def format_step(records: Counter) -> str:
    """Markdown: per component, the kernels, copies, allocations and Triton launches of one step."""
    by: Dict[str, Counter] = {}
    for (where, what, op), n in records.items():
        by.setdefault(where, Counter())[what] += n
    lines = ["| component | kernels | copies | allocations | Triton launches | views (free) |", "|---|---|---|---|---|---|"]
    for where, c in sorted(by.items(), key=lambda kv: -sum(v for k, v in kv[1].items() if k != "view")):
        lines.append(f"| {where} | {c['kernel']} | {c['copy']} | {c['alloc']} | {c['triton']} | {c['view']} |")
    total = Counter()
    for c in by.values():
        total.update(c)
    lines.append(f"| **step** | {total['kernel']} | {total['copy']} | {total['alloc']} | {total['triton']} | "
                 f"{total['view']} |")
    return "\n".join(lines)


def main(argv: Optional[List[str]] = None) -> int:
    import convs2s

    p = argparse.ArgumentParser(description="kernels a decoding step would launch on a GPU, counted on the CPU")
    p.add_argument("--arch", default="fconv_wmt_en_fr")
    p.add_argument("--vocab", type=int, default=40000)
    p.add_argument("--beam", type=int, default=5)
    p.add_argument("--sentences", type=int, default=2)
    p.add_argument("--length", type=int, default=10, help="source length (subwords)")
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--backend", default="triton,reference")
    args = p.parse_args(argv)
    os.environ.setdefault("TRITON_INTERPRET", "1")
    torch.manual_seed(0)
    model = convs2s.build_model(args.arch, args.vocab, args.vocab).fold_weight_norm().eval()
    sources = [[4 + i % (args.vocab - 4) for i in range(args.length)]] * args.sentences
    counts = count_generation(model, sources, beam=args.beam, steps=args.steps, backend=args.backend)
    step, records = steady_step(counts)
    print(f"{args.arch}, {args.sentences} sentences x beam {args.beam}, backend {args.backend}: step {step}")
    print(format_step(records))
    print("launches per step:", counts.per_step())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
