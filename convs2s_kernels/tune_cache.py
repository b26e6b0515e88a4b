"""Where measured kernel choices live between runs: one JSON file per machine key in the user's
cache (``$CONVS2S_TUNE_CACHE``, else ``$XDG_CACHE_HOME/convs2s`` or ``~/.cache/convs2s``).

A choice holds only on the machine it was measured on, so the key is everything that moves the
crossover: the CPU model, its instruction sets and the caps on them (oneDNN, MKL, ATen, the
project's own kernels), the thread count, torch's version and the extension build. A file whose
key differs (a stale build, another schema) or that does not parse is ignored with a warning
and replaced by the next measurement.
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import json
import os
import warnings
from pathlib import Path
from typing import Callable, Dict, Iterable, Optional, Tuple

import torch

from . import env
from .atomic_files import atomic_write_text
from .extension import small_gemm_isa

SCHEMA = 4  # 2: candidates timed in blocks (tune.timing.time_pair); 3: w8a8 against the reducing kernel at every
# bucket; 4: float32 GEMMs on the faster of ATen and oneDNN
DIR_ENV = "CONVS2S_TUNE_CACHE"


def _extension_build() -> str:
    """The extension file's size and modification time: a rebuild (new kernels) is a new key."""
    from . import extension

    path = getattr(extension._C, "__file__", None) if extension._C is not None else None
    if path is None:
        return "none"
    st = os.stat(path)
    return f"{st.st_size}-{int(st.st_mtime)}"


@functools.lru_cache(maxsize=None)
def _fixed_key() -> Tuple[Tuple[str, object], ...]:
    """What cannot change within a process: read once (the CPU's flags come from /proc/cpuinfo)."""
    return tuple(dict(schema=SCHEMA, cpu=env.cpu_model(), isa=env.instruction_sets(), kernels_isa=small_gemm_isa(),
                      torch=torch.__version__, extension=_extension_build()).items())


def machine_key() -> Dict[str, object]:
    return dict(_fixed_key(), caps=env.isa_caps(), threads=torch.get_num_threads())


def cache_dir() -> Path:
    if os.environ.get(DIR_ENV):
        return Path(os.environ[DIR_ENV])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "convs2s"


def cache_path(key: Optional[Dict[str, object]] = None, kind: str = "kernel-choice") -> Path:
    """The file of ``kind`` (the kernel choice; ``convs2s.compute_type`` keeps its own) for ``key``."""
    key = key or machine_key()
    digest = hashlib.sha1(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    return cache_dir() / f"{kind}-{digest}.json"


def entries_at(path: Path, key: Dict[str, object]) -> Dict[str, dict]:
    """The entries of a choice file (``{key, entries}``), or none when it is missing, unreadable or
    of another key: the silent reader of the files kept beside the kernel choice's."""
    try:
        data = json.loads(path.read_text())
        ok = isinstance(data, dict) and data.get("key") == key and isinstance(data.get("entries"), dict)
        return data["entries"] if ok else {}
    except (OSError, ValueError):
        return {}


def load(key: Optional[Dict[str, object]] = None, quiet: bool = False) -> Dict[str, dict]:
    """The cached entries for this machine (shape name -> entry), empty when there are none or
    the file cannot be trusted (a warning says why, unless ``quiet``)."""
    key = key or machine_key()
    if quiet:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return load(key)
    path = cache_path(key)
    if not path.exists():
        return {}
    try:
        data = json.loads(path.read_text())
        if not isinstance(data, dict) or not isinstance(data.get("entries"), dict):
            raise ValueError("no entries")
    except (OSError, ValueError) as exc:
        warnings.warn(f"ignoring the kernel-choice cache {path}: unreadable ({exc}); it will be measured again")
        return {}
    if data.get("key") != key:
        warnings.warn(f"ignoring the kernel-choice cache {path}: it was measured for another machine or build")
        return {}
    good = {name: e for name, e in data["entries"].items() if _well_formed(e)}
    if len(good) != len(data["entries"]):
        bad = sorted(set(data["entries"]) - set(good))
        warnings.warn(f"ignoring {len(bad)} malformed entries of the kernel-choice cache {path} ({bad[0]}, ...); "
                      "they will be measured again")
    return good


def _well_formed(entry) -> bool:
    """An entry the choice can be read from: timings {rows: [kernel us, GEMM us]}, rows and times numbers."""
    try:
        timings = entry["timings"]
        return isinstance(timings, dict) and all(int(r) > 0 and len(t) == 2 and all(float(x) >= 0 for x in t)
                                                 for r, t in timings.items())
    except (KeyError, TypeError, ValueError):
        return False


def save(entries: Dict[str, dict], key: Optional[Dict[str, object]] = None, drop: Iterable[str] = ()) -> Path:
    """Write the entries atomically (a run interrupted mid-write leaves the old file), merged over
    what another process may have written since this one read the file, less the names in ``drop``
    (to be measured again). The read, merge and write hold a lock beside the file, so two processes
    saving at once both keep their entries."""
    key = key or machine_key()
    path = cache_path(key)
    save_merged(path, key, entries, lambda: load(key, quiet=True), drop)
    return path


def save_merged(path: Path, key: Dict[str, object], entries: Dict[str, dict],
                current: Callable[[], Dict[str, dict]], drop: Iterable[str] = ()) -> None:
    """``{key, entries}`` written to ``path`` atomically, merged over ``current()`` (the file's
    entries, read under a lock beside it), less the names in ``drop``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        merged = {**current(), **entries}
        for name in drop:
            merged.pop(name, None)
        atomic_write_text(path, json.dumps(dict(key=key, entries=merged), indent=1, sort_keys=True))
