"""A faster memory allocator for the command line.

Decoding allocates and frees the same few tensor shapes at every step, and a long job meets
hundreds of shapes (one per batch). glibc's malloc ages badly under that pattern (a batch slows
down after many others of varied shapes), and even fresh big batches ran slower than under tcmalloc
(bench/results/kernel-decisions.md#allocator-tcmalloc). ``python3 -m convs2s`` therefore re-executes
itself once with tcmalloc (or jemalloc) preloaded when one is installed, as PyTorch's own CPU
launcher (``torch.backends.xeon.run_cpu``) does. ``CONVS2S_ALLOCATOR=system`` keeps glibc's
malloc; ``CONVS2S_ALLOCATOR=/path/to/lib.so`` picks a library. Importing convs2s as a library
changes nothing: preload one yourself (``LD_PRELOAD``) to get the same effect.
"""

from __future__ import annotations

import os
import sys
from typing import List, Optional, Sequence

ENV = "CONVS2S_ALLOCATOR"
_REEXEC = "CONVS2S_ALLOCATOR_REEXEC"  # set in the re-executed process: never loop
LIBRARIES = ("libtcmalloc_minimal.so.4", "libtcmalloc.so.4", "libjemalloc.so.2")
SEARCH_DIRS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib", "/usr/local/lib")
KNOWN = ("tcmalloc", "jemalloc")


def find_library(dirs: Sequence[str] = SEARCH_DIRS) -> Optional[str]:
    """The first installed tcmalloc/jemalloc shared library, or None."""
    for name in LIBRARIES:
        for d in dirs:
            path = os.path.join(d, name)
            if os.path.exists(path):
                return path
    return None


def preload_command(argv: Sequence[str], environ=os.environ, dirs: Sequence[str] = SEARCH_DIRS):
    """``(executable, args, env)`` to re-execute ``python -m convs2s ARGV`` with a faster
    allocator preloaded, or None when there is nothing to do (asked not to, already preloaded,
    already re-executed, not Linux, or none installed)."""
    choice = environ.get(ENV, "")
    preloaded = environ.get("LD_PRELOAD", "")
    if choice == "system" or environ.get(_REEXEC) or not sys.platform.startswith("linux"):
        return None
    if any(k in preloaded for k in KNOWN):
        return None
    lib = choice or find_library(dirs)
    if not lib:
        return None
    if not os.path.exists(lib):
        raise SystemExit(f"error: {ENV}={lib}: no such file (use 'system' for glibc's malloc)")
    env = dict(environ, LD_PRELOAD=lib + (":" + preloaded if preloaded else ""), **{_REEXEC: "1"})
    return sys.executable, [sys.executable, "-m", "convs2s", *argv], env


def reexec_with_fast_allocator(argv: List[str]) -> None:
    """Replace this process by ``python -m convs2s ARGV`` under tcmalloc/jemalloc when useful."""
    cmd = preload_command(argv)
    if cmd is not None:
        sys.stdout.flush()
        sys.stderr.flush()
        os.execve(*cmd)
