"""``output_loss`` on the cpp backend (``csrc/output_loss_cpu.cpp``): the logits of a block of rows
made, reduced and turned into their gradient while the block is in cache (``BLOCK_ROWS`` rows x V
floats, a few MB: in L3), then multiplied into the input's and the weight's gradients; the whole
``(N, V)`` logits never exist, nor their log-softmax or its gradient (each N x V x 4 bytes, 45 MB
at 2,000 tokens and 5.5K words, written and read several times by the plain composition). The
loss being the end of the graph, the gradients are made with it and scaled by the incoming
gradient in backward. In bfloat16 (bf16 autocast) the products run in bf16 on ATen's GEMM, as
autocast's ``F.linear`` would, and the block's passes read it as float32 lanes (the bias added in
float32) and write its gradient back in bf16; the loss is float32.

In float32 with gradients, the logits' and the weight gradient's products run on ATen's GEMM (MKL)
or on oneDNN's inner product, in 512- or 1,024-row blocks: whichever was measured fastest for the
output layer's shape on this machine (:func:`gemm_choice`, once, kept in the kernel-choice cache;
``CONVS2S_OUTPUT_LOSS_GEMM=aten|onednn`` overrides it). MKL runs AVX2 code on AMD CPUs, where
oneDNN took 10% less time for the whole op (bench/results/amd-epyc-2c/README.md).

Eager calls take a plain ``autograd.Function``; under ``torch.compile`` the kernel is the
``torch.library`` custom op ``convs2s::output_loss_cpu`` (traced as one node, its gradients made
with the loss and scaled in backward as eager's), which makes the GEMM choice where it runs,
outside the traced code."""

from __future__ import annotations

import json
import os
import statistics
import time
import warnings
from typing import Dict, Optional, Tuple

import torch
from torch import Tensor

from ... import tune_cache
from ...dispatch import Capability, note_variant, register
from ...extension import native
from .api import output_loss_tensors

CAPABILITY = Capability(dtypes={"cpu": (torch.float32, torch.float64, torch.bfloat16)}, backward=True)
BLOCK_ROWS = 512  # 512 x 5.5K words x 4 bytes = 11 MB: in L3 (bench/results/amd-zen3-2c/training-ops.md)
# float32 rows are padded to a multiple of this (zero rows, ignored targets): MKL's GEMM runs the
# logits' product slower at other row counts (bench/results/amd-zen3-2c/training-ops.md, "Block rows")
ALIGN_ROWS = 8


GEMM_ENV = "CONVS2S_OUTPUT_LOSS_GEMM"  # auto (measured) | aten | onednn
LIBRARIES = {"aten": 0, "onednn": 1}  # the extension's codes
# (library, block rows) measured against each other; the first holds unless another is 3% faster
CANDIDATES = (("aten", None), ("onednn", None), ("onednn", 1024))  # None: BLOCK_ROWS
MARGIN = 0.03
CACHE_KIND = "output-loss-gemm"
_chosen: Dict[Tuple, Tuple[str, int]] = {}  # (V, C, machine key) -> (library, block rows) in this process


def onednn_usable() -> bool:
    """Whether oneDNN may take the products here: torch's op present and working, not switched off."""
    return bool(torch.backends.mkldnn.enabled and native().onednn_gemm_available())


def _cache():
    key = dict(tune_cache.machine_key(), kind=CACHE_KIND)
    return tune_cache.cache_path(key, kind=CACHE_KIND), key


def measure_candidates(v: int, c: int, rows: int = 1024, rounds: int = 5) -> Dict[str, float]:
    """Median seconds of the float32 op with gradients (its three products and passes) at ``rows``
    rows of a (v, c) output layer, per candidate, interleaved (each warmed up once first)."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(rows, c, generator=g)
    w = torch.randn(v, c, generator=g) / c ** 0.5
    b = torch.zeros(v)
    t = torch.randint(0, v, (rows,), generator=g)
    runs = {}
    for lib, block in CANDIDATES:
        block = block or BLOCK_ROWS
        runs[f"{lib}:{block}"] = (lambda lib=lib, block=block:
                                  native().output_loss_forward(x, w, b, t, 0.1, -1, True, block, LIBRARIES[lib]))
    times = {name: [] for name in runs}
    for fn in runs.values():
        fn()
    for r in range(rounds):
        for name in (list(runs) if r % 2 == 0 else list(reversed(runs))):
            t0 = time.perf_counter()
            runs[name]()
            times[name].append(time.perf_counter() - t0)
    return {name: statistics.median(ts) for name, ts in times.items()}


def pick_candidate(seconds: Dict[str, float]) -> Tuple[str, int]:
    """The fastest candidate, the first (ATen) unless another is ``MARGIN`` faster."""
    first = next(iter(seconds))
    best = min(seconds, key=seconds.get)
    name = best if seconds[best] < (1 - MARGIN) * seconds[first] else first
    lib, block = name.split(":")
    return lib, int(block)


def gemm_choice(v: int, c: int) -> Tuple[str, int]:
    """(library, block rows) for float32 training at a (v, c) output layer: ``CONVS2S_OUTPUT_LOSS_GEMM``
    if set, else measured once per machine (and cached) while kernel tuning is on (``CONVS2S_TUNE``),
    else ATen's GEMM in ``BLOCK_ROWS``-row blocks."""
    env = os.environ.get(GEMM_ENV, "auto").strip().lower() or "auto"
    if env not in ("auto", *LIBRARIES):
        raise ValueError(f"{GEMM_ENV} must be auto, aten or onednn, got {env!r}")
    if env == "onednn" and not onednn_usable():
        raise RuntimeError(f"{GEMM_ENV}=onednn: this torch has no working oneDNN inner product "
                           "(or torch.backends.mkldnn.enabled is off)")
    if env != "auto":
        return env, BLOCK_ROWS
    if not onednn_usable():
        return "aten", BLOCK_ROWS
    from ...tune.policy import tuning_enabled

    key = (v, c, json.dumps(tune_cache.machine_key(), sort_keys=True))  # threads and caps included
    if key in _chosen:
        return _chosen[key]
    path, cache_key = _cache()
    name = f"{v}x{c}"
    entry = tune_cache.entries_at(path, cache_key).get(name)
    if isinstance(entry, dict) and entry.get("library") in LIBRARIES and isinstance(entry.get("block_rows"), int):
        choice = (entry["library"], entry["block_rows"])
    elif tuning_enabled():
        seconds = measure_candidates(v, c)
        choice = pick_candidate(seconds)
        try:
            tune_cache.save_merged(path, cache_key, {name: dict(library=choice[0], block_rows=choice[1], seconds=seconds)},
                                   lambda: tune_cache.entries_at(path, cache_key))
        except OSError as exc:  # a read-only cache: the choice still holds for this process
            warnings.warn(f"could not save output_loss's GEMM choice to {path} ({exc}); it will be measured again")
    else:
        choice = ("aten", BLOCK_ROWS)
    _chosen[key] = choice
    return choice


def _aligned(x, target, ignore_index):
    """``x`` and ``target`` with zero rows of ignored targets appended up to a multiple of ALIGN_ROWS."""
    pad = (-x.shape[0]) % ALIGN_ROWS
    if pad == 0 or x.dtype != torch.float32:
        return x, target
    return (torch.cat([x, x.new_zeros(pad, x.shape[1])]),
            torch.cat([target, target.new_full((pad,), ignore_index)]))


class _OutputLoss(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, target, eps, ignore_index):
        xa, ta = _aligned(x, target, ignore_index)
        library, block = gemm_choice(*weight.shape) if x.dtype == torch.float32 else ("aten", BLOCK_ROWS)
        loss, nll, dx, dw, db = native().output_loss_forward(xa, weight, bias, ta, eps, ignore_index, True, block,
                                                             LIBRARIES[library])
        if library != "aten":
            note_variant("output_loss", "cpp", f"{library} GEMM, {block}-row blocks")
        ctx.save_for_backward(dx[:x.shape[0]], dw, db if bias is not None else None)
        nll = nll.to(_loss_dtype(x))
        ctx.mark_non_differentiable(nll)
        return loss.to(_loss_dtype(x)), nll

    @staticmethod
    def backward(ctx, g, _g_nll):
        dx, dw, db = ctx.saved_tensors
        if g.numel() == 1 and float(g) == 1.0:  # loss.backward(): the saved gradients as they are, no pass over dw
            return dx, dw, db, None, None, None
        return dx * g, dw * g, None if db is None else db * g, None, None, None


def _loss_dtype(x):
    """float64 for float64 inputs, else float32 (the reference's log-softmax is float32 under bf16)."""
    return torch.float64 if x.dtype == torch.float64 else torch.float32


@torch.library.custom_op("convs2s::output_loss_cpu", mutates_args=())
def _output_loss_op(x: Tensor, weight: Tensor, bias: Optional[Tensor], target: Tensor, eps: float, ignore_index: int,
                    grads: bool) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """(loss, nll, dx, dweight, dbias): the gradients of ``loss`` made with it (empty without ``grads``).
    The GEMM choice is made here, where the op runs, not where it is traced (:func:`gemm_choice` asks
    the extension and the tuning cache; its answers are kept per layer shape); it is not counted as
    a variant in ``count_dispatches`` (the call is counted where it was traced, as ``cpp``)."""
    library, block = gemm_choice(*weight.shape) if grads and x.dtype == torch.float32 else ("aten", BLOCK_ROWS)
    xa, ta = _aligned(x, target, ignore_index)
    out = native().output_loss_forward(xa, weight, bias, ta, eps, ignore_index, grads, block, LIBRARIES[library])
    loss, nll = (t.to(_loss_dtype(x)) for t in out[:2])
    if not grads:
        return loss, nll, x.new_empty(0), x.new_empty(0), x.new_empty(0)
    dx, dw, db = out[2:]
    return loss, nll, dx[:x.shape[0]], dw, db


@_output_loss_op.register_fake
def _(x, weight, bias, target, eps, ignore_index, grads):
    loss, nll = (x.new_empty((), dtype=_loss_dtype(x)) for _ in range(2))
    if not grads:
        return loss, nll, x.new_empty(0), x.new_empty(0), x.new_empty(0)
    return loss, nll, x.new_empty(x.shape), weight.new_empty(weight.shape), weight.new_empty(weight.shape[0])


def _output_loss_setup(ctx, inputs, output):
    _loss, nll, dx, dw, db = output
    ctx.mark_non_differentiable(nll, dx, dw, db)
    ctx.save_for_backward(dx, dw, db)
    ctx.has_bias, ctx.grads = inputs[2] is not None, inputs[6]


def _output_loss_backward(ctx, g, *_):
    if not ctx.grads:
        raise RuntimeError("convs2s::output_loss_cpu was called with grads=False: it made no gradients")
    dx, dw, db = ctx.saved_tensors
    need = ctx.needs_input_grad
    return (dx * g if need[0] else None, dw * g if need[1] else None, db * g if ctx.has_bias and need[2] else None,
            None, None, None, None)


_output_loss_op.register_autograd(_output_loss_backward, setup_context=_output_loss_setup)


def output_loss_cpp(x, weight, bias, target, *, label_smoothing=0.0, ignore_index=1):
    if torch.compiler.is_compiling():  # the custom op: traced as one node
        grads = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (x, weight, bias))
        loss, nll, *_ = _output_loss_op(x, weight, bias, target, float(label_smoothing), int(ignore_index), grads)
        return loss, nll
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (x, weight, bias)):
        return _OutputLoss.apply(x, weight, bias, target, label_smoothing, ignore_index)
    xa, ta = _aligned(x, target, ignore_index)
    loss, nll = native().output_loss_forward(xa, weight, bias, ta, label_smoothing, ignore_index, False, BLOCK_ROWS)
    return loss.to(_loss_dtype(x)), nll.to(_loss_dtype(x))


register("cpp", "output_loss", output_loss_cpp, CAPABILITY, output_loss_tensors)
