"""Fetch Multi30k task 1 (raw, gzipped) from its public repository, or from a local mirror."""

from __future__ import annotations

import gzip
import os
import shutil
import urllib.error
import urllib.request
from pathlib import Path
from typing import Iterable, List, Union

from .atomic import atomic_open
from .data import DataError

URL = "https://raw.githubusercontent.com/multi30k/dataset/master/data/task1/raw"
SPLITS = ("train", "val", "test_2016_flickr", "test_2017_flickr", "test_2017_mscoco")
LANGS = ("en", "de", "fr")


def _fetch(source: str, dest: Path) -> None:
    """Copy ``source`` (a URL or a local file) to ``dest`` atomically, once it reads as whole gzip."""
    try:
        with atomic_open(dest) as out:
            if "://" in source:
                with urllib.request.urlopen(source, timeout=60) as resp:
                    shutil.copyfileobj(resp, out)
            else:
                with open(source, "rb") as src:
                    shutil.copyfileobj(src, out)
            out.flush()
            with gzip.open(out.name, "rb") as f:  # a truncated or HTML error page fails here, not in training
                while f.read(1 << 20):
                    pass
    except (urllib.error.URLError, OSError, EOFError) as exc:
        raise DataError(f"could not fetch {source}: {exc}") from None


def download(out_dir: Union[str, os.PathLike], langs: Iterable[str] = ("en", "de"),
             splits: Iterable[str] = SPLITS, mirror: str = URL, log=print) -> List[Path]:
    """Write ``{split}.{lang}.gz`` files into ``out_dir``; files already there are kept.

    ``mirror`` is the repository's raw-file URL or a local folder holding the same file names.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    bad = [lang for lang in langs if lang not in LANGS]
    if bad:
        raise DataError(f"Multi30k task 1 has no language {bad[0]!r}; choose from {', '.join(LANGS)}")
    written = []
    for split in splits:
        if split not in SPLITS:
            raise DataError(f"unknown Multi30k split {split!r}; choose from {', '.join(SPLITS)}")
        for lang in langs:
            name = f"{split}.{lang}.gz"
            dest = out / name
            if not dest.is_file():
                source = f"{mirror.rstrip('/')}/{name}" if "://" in mirror else str(Path(mirror) / name)
                log(f"fetching {source}")
                _fetch(source, dest)
            written.append(dest)
    return written
