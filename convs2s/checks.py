"""The cheap checks every command runs on its arguments before any expensive work (loading a
model, measuring, writing): files that must exist and be read, folders that must take a new file.
Each failure is a :class:`~convs2s.errors.Convs2sError` naming the flag and the path, which the
command line prints as one line with exit status 2.

Text inputs are read through once here (strict UTF-8, gzipped where the name ends in ``.gz``): a
bad byte at line 5,000 is found in a fraction of a second, not after minutes of translating.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

from .errors import Convs2sError


def _named(flag: Optional[str], path) -> str:
    return f"{flag} {path}" if flag else str(path)


def _a(what: str) -> str:
    return f"{'an' if what[0] in 'aeiou' else 'a'} {what}"


def existing_file(path, flag: Optional[str] = None, *, what: str = "file", allow_empty: bool = False) -> Path:
    """``path`` names a readable, non-empty (unless ``allow_empty``) file."""
    p = Path(path)
    if not p.exists():
        raise Convs2sError(f"{_named(flag, path)}: no such {what}")
    if p.is_dir():
        raise Convs2sError(f"{_named(flag, path)}: a folder, not {_a(what)}")
    if not os.access(p, os.R_OK):
        raise Convs2sError(f"{_named(flag, path)}: cannot be read (permission denied)")
    if not allow_empty and p.stat().st_size == 0:
        raise Convs2sError(f"{_named(flag, path)}: the {what} is empty")
    return p


def existing_folder(path, flag: Optional[str] = None, *, what: str = "folder") -> Path:
    p = Path(path)
    if not p.exists():
        raise Convs2sError(f"{_named(flag, path)}: no such {what}")
    if not p.is_dir():
        raise Convs2sError(f"{_named(flag, path)}: a file, not {_a(what)}")
    return p


def text_file(path, flag: Optional[str] = None, *, what: str = "text file") -> Path:
    """``path`` (``-``: stdin, not checked) is a non-empty file of UTF-8 text (gzipped if it ends
    in ``.gz``), read through once."""
    if path in (None, "-"):
        return Path("-")
    p = existing_file(path, flag, what=what)
    from .data import DataError, iter_lines

    lines = 0
    try:
        for lines, _ in iter_lines(p):
            pass
    except DataError as exc:
        raise Convs2sError(f"{flag + ' ' if flag else ''}{exc}") from None
    if lines == 0:  # a gzipped file of no text
        raise Convs2sError(f"{_named(flag, path)}: the {what} is empty")
    return p


def writable_file(path, flag: Optional[str] = None) -> Path:
    """A file may be written at ``path``: its folder exists and takes new files, and ``path`` is
    no folder (an existing file is replaced only once the command has its result)."""
    p = Path(path)
    if p.is_dir():
        raise Convs2sError(f"{_named(flag, path)} is a folder; name a file")
    parent = p.resolve().parent
    if not parent.is_dir():
        raise Convs2sError(f"{_named(flag, path)}: the folder {parent} does not exist")
    if not os.access(parent, os.W_OK | os.X_OK) or (p.exists() and not os.access(p, os.W_OK)):
        raise Convs2sError(f"{_named(flag, path)}: cannot be written (permission denied)")
    return p


def writable_folder(path, flag: Optional[str] = None) -> Path:
    """A folder that exists (or can be made: its nearest existing parent is a writable folder)."""
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise Convs2sError(f"{_named(flag, path)}: a file, not a folder")
    existing = p
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise Convs2sError(f"{_named(flag, path)}: {existing} is a file, not a folder")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise Convs2sError(f"{_named(flag, path)}: cannot be written (permission denied)")
    return p


def executable_file(path, flag: Optional[str] = None) -> Path:
    p = existing_file(path, flag, what="program")
    if not os.access(p, os.X_OK):
        raise Convs2sError(f"{_named(flag, path)}: not executable")
    return p
