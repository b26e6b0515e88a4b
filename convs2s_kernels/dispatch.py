"""Choose a backend for each call by device, dtype, autograd needs and availability.

Backends, in priority order per device:

* CPU tensors: ``cpp`` (the C++ extension) then ``reference``; ``triton`` runs CPU tensors
  only under its interpreter (``TRITON_INTERPRET=1``), and only when named: the interpreter
  proves the kernels correct but is far too slow for ``auto`` to pick it.
* CUDA tensors: ``triton`` then ``reference``.

A backend registers one implementation per op with a :class:`Capability` (devices, dtypes per
device, row limits, whether it has a backward) from which :func:`reasons` derives why it cannot
take given inputs (empty when it can). ``backend="auto"`` (the default, or the
``CONVS2S_KERNELS_BACKEND`` environment variable) takes the first backend with no
reasons; naming a backend that cannot run raises with its reasons listed.
"""

from __future__ import annotations

import logging
import os
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

import torch

BACKENDS = ("triton", "cpp", "reference")
ENV_VAR = "CONVS2S_KERNELS_BACKEND"

_log = logging.getLogger("convs2s_kernels")


class BackendUnavailableError(RuntimeError):
    """An explicitly requested backend cannot run the given inputs."""


@dataclass(frozen=True)
class Capability:
    """What one backend's implementation of an op accepts, declared rather than checked by hand.

    ``dtypes`` maps each device type the implementation runs on to the dtypes it takes there;
    ``rows`` bounds the rows of a 2-D activation (few-row decoding kernels); ``backward`` says
    whether it has a gradient; ``extra`` lists any further refusals of particular arguments.
    ``device_hint`` and ``dtype_hints`` explain the usual refusals in the user's terms.
    """

    dtypes: Mapping[str, Tuple[torch.dtype, ...]]
    backward: bool = False
    rows: Optional[Tuple[int, int]] = None
    extra: Optional[Callable[..., List[str]]] = None
    device_hint: str = ""
    dtype_hints: Mapping[torch.dtype, str] = field(default_factory=dict)

    def reasons(self, label: str, tensors: Sequence[Optional[torch.Tensor]], *args, **kwargs) -> List[str]:
        """Why ``label`` (e.g. ``"cpp linear"``) cannot take these inputs; ``tensors[0]`` is the
        activation (its device, dtype and rows decide), the rest are checked for gradients."""
        x = tensors[0]
        allowed = self.dtypes.get(x.device.type)
        if allowed is None:
            where = " or ".join(d.upper() for d in self.dtypes)
            return [f"{label} runs {where} tensors, got {x.device.type}{self.device_hint}"]
        why = []
        if x.dtype not in allowed:
            why.append(self.dtype_hints.get(x.dtype) or
                       f"{label} takes {', '.join(str(d) for d in allowed)} on {x.device.type}, got {x.dtype}")
        if self.rows is not None and (x.dim() != 2 or not self.rows[0] <= x.shape[0] <= self.rows[1]):
            why.append(f"{label} takes {self.rows[0]}..{self.rows[1]} rows of a 2-D input (decoding), "
                       f"got shape {tuple(x.shape)}")
        if not self.backward and torch.is_grad_enabled() and any(
                isinstance(t, torch.Tensor) and t.requires_grad for t in tensors):
            why.append(f"{label} has no backward; inputs require grad")
        if self.extra is not None:
            why.extend(self.extra(*args, **kwargs))
        return why


@dataclass(frozen=True)
class Impl:
    fn: Callable
    check: Callable[..., List[str]]


_REGISTRY: Dict[str, Dict[str, Impl]] = {name: {} for name in BACKENDS}
_AVAILABILITY: Dict[str, Callable[[], Optional[str]]] = {}
_fallback_logged: set = set()
_counters: List[Counter] = []  # open count_dispatches() blocks


@contextmanager
def count_dispatches() -> Iterator[Counter]:
    """Count the calls dispatched inside the block, per ``(op, backend)`` that ran them.

    Benchmarks label each timed row by what actually ran: a row that asked for ``cpp`` but had
    some op served by ``reference`` shows it. Blocks nest; each counts every call inside it.
    """
    counts: Counter = Counter()
    _counters.append(counts)
    try:
        yield counts
    finally:  # by identity: Counters compare by content, and nested blocks may hold equal ones
        del _counters[next(i for i, c in enumerate(_counters) if c is counts)]


def note_variant(op: str, backend: str, variant: str) -> None:
    """Relabel the call just counted for ``(op, backend)`` as ``(op, "backend, variant")`` in the
    open :func:`count_dispatches` blocks: what served it when a backend has more than one way
    (the cpp convolution's Winograd tiles in training), so a row names the algorithm that ran."""
    for counts in _counters:
        if counts[(op, backend)] > 0:
            counts[(op, backend)] -= 1
            if not counts[(op, backend)]:
                del counts[(op, backend)]
            counts[(op, f"{backend}, {variant}")] += 1


def register(backend: str, op: str, fn: Callable, capability: Optional[Capability] = None,
             tensors: Optional[Callable[..., Sequence]] = None) -> Callable:
    """``fn`` implements ``op`` on ``backend``, taking what ``capability`` declares.

    ``tensors(*args, **kwargs)`` picks the call's floating tensors, the activation first (each
    op's module defines it once for all its backends). No capability: takes everything (the
    reference).
    """
    if capability is None:
        check = lambda *a, **k: []  # noqa: E731
    else:
        label = f"{backend} {op}"
        check = lambda *a, **k: capability.reasons(label, tensors(*a, **k), *a, **k)  # noqa: E731
    _REGISTRY[backend][op] = Impl(fn, check)
    return fn


def set_availability(backend: str, probe: Callable[[], Optional[str]]) -> None:
    """``probe()`` returns None when the backend can run on this machine, else why not."""
    _AVAILABILITY[backend] = probe


def backend_unavailable_reason(backend: str) -> Optional[str]:
    probe = _AVAILABILITY.get(backend)
    return probe() if probe is not None else None


def available_backends() -> Dict[str, Optional[str]]:
    """Every backend mapped to None when it runs here, or the reason it does not."""
    return {name: backend_unavailable_reason(name) for name in BACKENDS}


def _priority(device: torch.device) -> List[str]:
    if device.type == "cuda":
        return ["triton", "reference"]
    return ["cpp", "reference"]


def requested_backends(backend: Optional[str]) -> List[str]:
    """Parse a backend request: ``auto``, one name (strict), or a comma-separated preference list."""
    text = (backend or os.environ.get(ENV_VAR) or "auto").strip().lower()
    choices = [c.strip() for c in text.split(",") if c.strip()] or ["auto"]
    for c in choices:
        if c != "auto" and c not in BACKENDS:
            raise ValueError(
                f"unknown backend {c!r} (from {'backend=' if backend else ENV_VAR}); "
                f"choose auto, one of {', '.join(BACKENDS)}, or a comma-separated preference list"
            )
    return choices


def reasons(backend: str, op: str, device: torch.device, *args, **kwargs) -> List[str]:
    """Why ``backend`` cannot run ``op`` on these inputs (empty list: it can)."""
    why = backend_unavailable_reason(backend)
    if why:
        return [why]
    impl = _REGISTRY[backend].get(op)
    if impl is None:
        return [f"{backend} has no implementation of {op}"]
    return impl.check(*args, **kwargs)


def selected_backend_name(op: str, device: torch.device, backend: Optional[str], *args, **kwargs) -> str:
    """The backend that runs ``op`` on these inputs (raises when none can).

    One named backend is strict (it runs or raises with its reasons); ``auto`` walks the
    device's priority order; a list such as ``"cpp,reference"`` takes the first that can run.
    """
    choices = requested_backends(backend)
    if len(choices) == 1 and choices[0] != "auto":
        why = reasons(choices[0], op, device, *args, **kwargs)
        if why:
            source = "" if backend else f" (from {ENV_VAR}; a list such as '{choices[0]},reference' falls back)"
            raise BackendUnavailableError(f"backend {choices[0]!r}{source} cannot run {op}: " + "; ".join(why))
        return choices[0]
    order: List[str] = []
    for c in choices:
        for name in (_priority(device) if c == "auto" else [c]):
            if name not in order:
                order.append(name)
    skipped = []
    for name in order:
        why = reasons(name, op, device, *args, **kwargs)
        if not why:
            if skipped:
                key = (op, device.type, tuple(skipped))
                if key not in _fallback_logged:
                    _fallback_logged.add(key)
                    _log.debug("%s on %s: using %s (skipped %s)", op, device.type, name, "; ".join(skipped))
            return name
        skipped.append(f"{name}: {'; '.join(why)}")
    raise BackendUnavailableError(f"no backend can run {op}: " + " | ".join(skipped))


def resolve(op: str, device: torch.device, backend: Optional[str], *args, **kwargs) -> Callable:
    """The implementation of ``op`` to call for these inputs (see :func:`selected_backend_name`);
    the call is counted in the open :func:`count_dispatches` blocks."""
    name = selected_backend_name(op, device, backend, *args, **kwargs)
    for counts in _counters:
        counts[(op, name)] += 1
    return _REGISTRY[name][op].fn


def bind(op: str, device: torch.device, backend: Optional[str], *args, **kwargs) -> Callable:
    """The implementation :func:`resolve` picks for these inputs, as a callable for later calls of
    the same kind (a decoding step's, whose shapes and dtypes repeat): no checks, no choice, each
    call still counted in the open :func:`count_dispatches` blocks. The caller vouches that later
    inputs are like these."""
    name = selected_backend_name(op, device, backend, *args, **kwargs)
    fn = _REGISTRY[name][op].fn

    def call(*a, **k):
        for counts in _counters:
            counts[(op, name)] += 1
        return fn(*a, **k)

    return call


class BoundCalls:
    """Calls of public ops whose inputs repeat in kind (a decoding loop's, step after step): the
    first call of each ``(op, backend, key)`` goes through the public function (its checks, its
    dispatch), later ones straight to the implementation chosen then (:func:`bind`). ``key`` names
    what makes calls alike for the caller (e.g. the batch's rows); a new key is checked again.
    Under autocast every call goes through the public function, whose casts a bound call would skip."""

    def __init__(self):
        self._bound: Dict[tuple, Callable] = {}

    def __call__(self, public_fn: Callable, key, device: torch.device, *args, backend: Optional[str] = None,
                 **kwargs):
        if torch.is_autocast_enabled(device.type):  # the public function casts the inputs: never bound
            return public_fn(*args, backend=backend, **kwargs)
        op = public_fn.__name__
        fn = self._bound.get((op, backend, key))
        if fn is not None:
            return fn(*args, **kwargs)
        out = public_fn(*args, backend=backend, **kwargs)
        self._bound[(op, backend, key)] = bind(op, device, backend, *args, **kwargs)
        return out
