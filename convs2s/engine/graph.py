"""A decoding step recorded once and replayed: one CUDA graph launch instead of hundreds of kernel
launches (:mod:`convs2s.engine.recorded_search` records the search's whole step with it).

:class:`StepGraph` runs a step function on fixed buffers: its first call runs eagerly (the warm-up:
Triton tunes and compiles, libraries allocate their workspaces), its second records the step and
runs it, every later call replays the recording. What a replay computes is what the recording
saw: the same kernels on the same buffers with the same scalar arguments. So everything a step
reads that changes from step to step must be a tensor written in place (the tokens, the position,
the parents, the conv states), never a Python number; the decoder's static mode
(:meth:`convs2s.engine.DecoderState.make_static`) is written that way.

Two recorders:

* :class:`CudaRecorder` — ``torch.cuda.CUDAGraph`` (the real thing, on CUDA tensors);
* :class:`OpRecorder` — the same contract on any device: it records the ATen operations the step
  runs (a ``TorchDispatchMode``) and a replay re-runs exactly those operations, with the scalars
  they were called with, into the buffers they wrote. A step that reads a Python value that
  changes, reads a tensor on the host, or makes a shape that depends on data gives a wrong result
  or an error here as it would in a CUDA graph, so the CPU tests check the GPU's contract. It sees
  only ATen operations: kernels called outside the dispatcher (the cpp extension's direct calls,
  Triton launches) would be skipped by a replay, so it refuses steps that ran them.
"""

from __future__ import annotations

from typing import Callable, Dict, List, Optional, Tuple

import torch
import torch.utils._pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

import convs2s_kernels as ck

from ..errors import Convs2sError

aten = torch.ops.aten


class StepGraphError(Convs2sError):
    """A step that cannot be recorded and replayed (the message names the operation)."""


# Operations that read a tensor on the host or make a shape from its values: a CUDA graph cannot
# hold them (capture fails, or the replay keeps the recorded shape).
_HOST_READS = {aten._local_scalar_dense.default, aten.nonzero.default, aten.masked_select.default,
               aten.is_nonzero.default, aten.equal.default, aten._unique2.default, aten.unique_dim.default,
               aten.unique_consecutive.default, aten.repeat_interleave.Tensor}


# Indexing by a boolean mask finds the mask's True entries on the host first.
_INDEXING = {aten.index.Tensor, aten.index_put.default, aten.index_put_.default, aten._index_put_impl_.default}


def _mask_indexing(func, args) -> bool:
    return func in _INDEXING and len(args) > 1 and any(
        isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in args[1])


class _Recording(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops: List[Tuple] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _HOST_READS or _mask_indexing(func, args):
            raise StepGraphError(f"a recorded step may not call {func} (it reads tensor values on the host or "
                                 "makes a shape from them)")
        out = func(*args, **kwargs)
        self.ops.append((func, args, kwargs, out))
        return out


def _writes_its_result_in_place(func) -> bool:
    """In-place and ``out=`` operations return a tensor they wrote; views return an alias of
    their input. A replay of either leaves the recorded result up to date by itself."""
    return func._schema.is_mutable or func.is_view


class OpRecorder:
    """Records the ATen operations of a step and replays them (see the module's docstring)."""

    def __init__(self, device: Optional[torch.device] = None):
        self.ops: List[Tuple] = []
        self.outputs = None

    def capture(self, fn: Callable):
        with ck.count_dispatches() as counts, _Recording() as rec:
            self.outputs = fn()
        native = sorted({f"{op} ({backend})" for (op, backend) in counts if backend != "reference"})
        if native:
            raise StepGraphError("the op recorder replays only ATen operations, but the step ran "
                                 f"{', '.join(native)}: record it with backend='reference'")
        self.ops = rec.ops
        return self.outputs

    def replay(self):
        for func, args, kwargs, out in self.ops:
            result = func(*args, **kwargs)
            if _writes_its_result_in_place(func):
                continue
            for recorded, new in zip(pytree.tree_leaves(out), pytree.tree_leaves(result)):
                if isinstance(recorded, torch.Tensor):
                    recorded.copy_(new)
        return self.outputs


class CudaRecorder:
    """``torch.cuda.CUDAGraph`` behind the recorder interface; ``pool`` shares memory between the
    graphs of one ``generate`` call (only the newest is ever replayed)."""

    _streams: Dict[torch.device, "torch.cuda.Stream"] = {}  # one capture stream per device

    def __init__(self, device: torch.device, pool=None):
        self.device, self.pool = device, pool
        self.graph = torch.cuda.CUDAGraph()
        self.outputs = None

    def capture(self, fn: Callable):
        # capture_begin/end directly: torch.cuda.graph() would first synchronise the device and empty
        # the allocator's caches, costs paid a few times per batch for memory the pool reuses anyway
        with torch.cuda.device(self.device):
            stream = self._streams.setdefault(self.device, torch.cuda.Stream(self.device))
            stream.wait_stream(torch.cuda.current_stream())
            try:
                with torch.cuda.stream(stream):
                    self.graph.capture_begin(pool=self.pool)
                    try:
                        self.outputs = fn()
                    finally:
                        self.graph.capture_end()
            except Exception as exc:
                raise StepGraphError(f"recording the decoding step as a CUDA graph failed ({exc}); decode eagerly "
                                     "with generate(observer=Observer(cuda_graph=False)) or --no-cuda-graph") from exc
            torch.cuda.current_stream().wait_stream(stream)
            self.graph.replay()  # capturing records the kernels without running them
        return self.outputs

    def replay(self):
        with torch.cuda.device(self.device):
            self.graph.replay()
        return self.outputs


def warm_up(fn: Callable, device: torch.device):
    """One eager run before recording; on CUDA on a side stream, as ``torch.cuda.graphs`` asks."""
    if device.type != "cuda":
        return fn()
    with torch.cuda.device(device):
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            out = fn()
        torch.cuda.current_stream().wait_stream(side)
    return out


class StepGraph:
    """``fn()`` run as warm-up, then recorded, then replayed (see the module's docstring).

    ``fn`` reads only fixed buffers and returns fixed tensors: the caller writes the next step's
    inputs into them before each call and reads the outputs before the next. A call that raises
    does not count: the next one warms up or records again. ``warmed``: the operations ``fn`` runs
    have already run eagerly on these buffers (another step function's warm-up), so the first call
    records.
    """

    def __init__(self, fn: Callable, recorder, device: torch.device, warmed: bool = False):
        self.fn, self.recorder, self.device = fn, recorder, device
        self.calls = 1 if warmed else 0  # warmed: what fn runs has run eagerly already (no warm-up call)

    def __call__(self):
        if self.calls == 0:
            out = warm_up(self.fn, self.device)
        elif self.calls == 1:
            out = self.recorder.capture(self.fn)
        else:
            out = self.recorder.replay()
        self.calls += 1
        return out


MODES = (None, False, True, "record-ops")


def recorder_factory(mode, device: torch.device) -> Optional[Callable[[torch.device], object]]:
    """What records decoding steps for ``generate(observer=Observer(cuda_graph=mode))`` on ``device`` (called with the
    device, it gives a recorder), or None (eager).

    ``None`` (default): CUDA graphs on CUDA, eager elsewhere; ``True``: CUDA graphs (CUDA tensors
    only); ``False``: eager; ``"record-ops"``: the op recorder on any device (the CPU tests, and a
    way to check on a CPU what a graph would compute; ``backend="reference"`` only).

    With a recorded step, finished sentences leave the batch once they are half of it (each new
    row count is a new recording) instead of at once: the same n-best lists, up to the rounding
    of products over another number of rows."""
    if mode not in MODES:
        raise ValueError(f"cuda_graph must be None, True, False or 'record-ops', got {mode!r}")
    if mode == "record-ops":
        return OpRecorder
    if mode is False or (mode is None and device.type != "cuda"):
        return None
    if device.type != "cuda":
        raise ValueError(f"cuda_graph=True needs the model on a CUDA device, not {device.type}")
    pool = torch.cuda.graph_pool_handle()
    return lambda dev: CudaRecorder(dev, pool)
