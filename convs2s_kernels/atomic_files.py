"""Whole files written atomically, for the kernel library and the model package alike
(``convs2s.atomic`` builds on it): into a temporary file beside the target with a name of its
own (two processes writing the same target never share one), flushed to disk, then renamed over
the target, so an interrupted write never leaves a half-written file (the old one stays)."""

from __future__ import annotations

import os
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO, Iterator, Union

PathLike = Union[str, os.PathLike]


@contextmanager
def atomic_open(path: PathLike) -> Iterator[BinaryIO]:
    """A binary file to write ``path`` through: it replaces ``path`` when the block ends without an
    error; on an error or interruption it is removed and ``path`` is left untouched."""
    path = Path(path)
    # a name of its own (and "x": never someone else's file), with the umask's usual permissions
    tmp = path.with_name(f"{path.name}.{os.getpid()}-{uuid.uuid4().hex[:8]}.tmp")
    try:
        with open(tmp, "xb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def atomic_write_text(path: PathLike, text: str) -> None:
    with atomic_open(path) as f:
        f.write(text.encode("utf-8"))
