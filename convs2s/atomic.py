"""Atomic file writes: write a temporary file beside the target, then rename it over the target,
so an interrupted write never leaves a half-written checkpoint, dataset or report behind."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Union

import torch

PathLike = Union[str, os.PathLike]


def _tmp(path: Path) -> Path:
    return path.with_name(path.name + ".tmp")


def atomic_torch_save(obj: Any, path: PathLike) -> None:
    path = Path(path)
    torch.save(obj, _tmp(path))
    os.replace(_tmp(path), path)


def atomic_write_bytes(path: PathLike, data: bytes) -> None:
    path = Path(path)
    _tmp(path).write_bytes(data)
    os.replace(_tmp(path), path)


def atomic_write_text(path: PathLike, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))
