"""Every file convs2s writes goes through here.

Whole files (checkpoints, datasets, dictionaries, reports, downloads) are written atomically
(:func:`atomic_open`, from :mod:`convs2s_kernels.atomic_files`, which the kernel library's own
files use too): into a temporary file beside the target, flushed to disk, then renamed over the
target, so an interrupted write never leaves a half-written file behind (the old file, if any,
stays as it was). Logs grow by whole lines (:func:`append_line`).
"""

from __future__ import annotations

import os
from typing import Any

import torch

from convs2s_kernels.atomic_files import PathLike, atomic_open  # noqa: F401  (part of this module's API)


def atomic_write_bytes(path: PathLike, data: bytes) -> None:
    with atomic_open(path) as f:
        f.write(data)


def atomic_write_text(path: PathLike, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_torch_save(obj: Any, path: PathLike) -> None:
    with atomic_open(path) as f:
        torch.save(obj, f)


def append_line(path: PathLike, line: str) -> None:
    """Append ``line`` and a newline to ``path`` (created when missing) in one write: a reader
    polling the file, or a run killed meanwhile, sees the whole line or none of it."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
    try:
        os.write(fd, (line + "\n").encode("utf-8"))
    finally:
        os.close(fd)
