"""The choices in force in this process, the package's one mutable state: what was handed to the
extension (:func:`apply`), for which machine key, and which shapes were left at the default with
measuring off. :func:`ensure` hands the extension a choice for every shape (from this process, the
machine's cache, or measured now); :func:`forget` drops them; ``CONVS2S_TUNE`` and
:func:`measuring` say whether a missing shape is measured."""

from __future__ import annotations

import contextlib
import os
import sys
import warnings
from typing import Dict, Iterable, Optional, Sequence, Tuple

from tqdm import tqdm

from .. import tune_cache
from ..extension import native, unavailable_reason
from .rules import entry_timings, kernel_rows, library_ranges
from .shapes import FORMS, Shape, library_shape
from .timing import measure

ENV = "CONVS2S_TUNE"
_applied: Dict[str, dict] = {}  # shape name -> entry handed to the extension in this process
_applied_keys: Dict[Tuple[str, str, int, int], str] = {}  # the extension's key -> the shape name in force for it
_unmeasured: set = set()  # shapes looked up and left at the default (measuring off), under _applied_key
_applied_key: Optional[dict] = None  # the machine key (threads, caps included) the choices above hold for
_measuring: Optional[bool] = None  # set by measuring(): overrides CONVS2S_TUNE while in force


def _key(shape: Shape) -> Tuple[str, str, int, int]:
    """What the extension keys a choice by: shapes alike in it share one."""
    return shape.form, shape.dtype, shape.K, shape.N


def apply(shape: Shape, entry: dict) -> None:
    C = native()
    C.set_few_rows_choice(FORMS[shape.form], shape.dtype, shape.K, shape.N,
                          kernel_rows(entry_timings(entry), C.few_rows_max()))
    if library_shape(shape):  # an entry without a library: ATen's throughout
        C.set_gemm_library_choice(FORMS[shape.form], shape.dtype, shape.K, shape.N, *library_ranges(entry))
    _applied[shape.name] = entry
    _applied_keys[_key(shape)] = shape.name


def tuning_enabled() -> bool:
    if _measuring is not None:
        return _measuring
    return os.environ.get(ENV, "1").strip().lower() not in ("0", "off", "false", "no")


@contextlib.contextmanager
def measuring(enabled: bool):
    """Within it, missing shapes are measured (or, ``False``, left at the default) whatever
    CONVS2S_TUNE says: e.g. a trainer's validation, whose many-row products never take the few-row
    kernels and whose processes would all time kernels at once on shared cores."""
    global _measuring
    before, _measuring = _measuring, enabled
    try:
        yield
    finally:
        _measuring = before


def ensure(shapes: Iterable[Shape], *, measure_missing: Optional[bool] = None) -> Dict[str, dict]:
    """Hand the extension a choice for every shape: from this process, from the machine's cache, or
    measured now (and cached) unless measuring is off. Returns the entries in force. A new thread
    count or cap drops the choices in force first (they were measured for another machine key).
    A no-op without the extension (nothing runs the kernels then)."""
    if unavailable_reason() is not None:
        return {}
    global _applied_key
    # Shapes alike in (form, dtype, K, N) share the extension's one choice: the first measured or read holds.
    shapes = list(dict.fromkeys(shapes))
    key = tune_cache.machine_key()
    if key != _applied_key:  # another thread count (or cap): the choices in force do not hold
        forget()
        _applied_key = key
    measuring = tuning_enabled() if measure_missing is None else measure_missing
    missing = [s for s in shapes if _key(s) not in _applied_keys and (measuring or s.name not in _unmeasured)]
    if not missing:
        return _in_force(shapes)
    cached = tune_cache.load(key)
    todo = []
    for s in missing:
        if _key(s) in _applied_keys:  # an earlier shape of the list, alike in the extension's key
            continue
        if s.name in cached:
            apply(s, cached[s.name])
        else:
            todo.append(s)
    if todo and not measuring:
        _unmeasured.update(s.name for s in todo)
    elif todo:
        for s in tqdm(todo, desc="measuring few-row kernels vs GEMM (once per machine)", unit="shape",
                      disable=not sys.stderr.isatty(), leave=False):
            if _key(s) in _applied_keys:
                continue
            cached[s.name] = measure(s)
            apply(s, cached[s.name])
        try:
            tune_cache.save(cached, key)
        except OSError as exc:  # a read-only home: the choice still holds for this process
            warnings.warn(f"could not save the kernel choice to {tune_cache.cache_path(key)} ({exc}); "
                          f"it will be measured again next time (set {tune_cache.DIR_ENV} to a writable folder)")
    return _in_force(shapes)


def _in_force(shapes: Sequence[Shape]) -> Dict[str, dict]:
    """Each shape's entry in force: its own, or that of the shape alike in the extension's key."""
    return {s.name: _applied[_applied_keys[_key(s)]] for s in shapes if _key(s) in _applied_keys}


def forget() -> None:
    """Drop the limits handed to the extension in this process (the defaults apply again)."""
    native().clear_few_rows_choices()
    _applied.clear()
    _applied_keys.clear()
    _unmeasured.clear()
