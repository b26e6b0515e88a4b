"""The command line's allocator choice (convs2s.allocator): re-execute under tcmalloc/jemalloc
when one is installed, never twice, never when told not to."""

import subprocess
import sys

import pytest

from convs2s.allocator import ENV, find_library, preload_command


@pytest.fixture
def libdir(tmp_path):
    (tmp_path / "libjemalloc.so.2").write_bytes(b"")
    (tmp_path / "libtcmalloc_minimal.so.4").write_bytes(b"")
    return tmp_path


def test_finds_tcmalloc_first(libdir, tmp_path):
    assert find_library([str(libdir)]) == str(libdir / "libtcmalloc_minimal.so.4")
    (libdir / "libtcmalloc_minimal.so.4").unlink()
    assert find_library([str(libdir)]) == str(libdir / "libjemalloc.so.2")
    assert find_library([str(tmp_path / "empty")]) is None


def test_reexec_command_preloads_the_library(libdir):
    exe, args, env = preload_command(["bench", "speed-table"], {"LD_PRELOAD": "libx.so", "HOME": "/h"},
                                     [str(libdir)])
    assert exe == sys.executable and args == [sys.executable, "-m", "convs2s", "bench", "speed-table"]
    assert env["LD_PRELOAD"] == f"{libdir / 'libtcmalloc_minimal.so.4'}:libx.so" and env["HOME"] == "/h"
    # the re-executed process does not loop
    assert preload_command(["x"], env, [str(libdir)]) is None


def test_no_reexec_when_told_or_already_preloaded_or_nothing_installed(libdir, tmp_path):
    dirs = [str(libdir)]
    assert preload_command(["x"], {ENV: "system"}, dirs) is None
    assert preload_command(["x"], {"LD_PRELOAD": "/opt/libjemalloc.so.2"}, dirs) is None
    assert preload_command(["x"], {}, [str(tmp_path / "none")]) is None
    chosen = preload_command(["x"], {ENV: str(libdir / "libjemalloc.so.2")}, [])
    assert chosen[2]["LD_PRELOAD"] == str(libdir / "libjemalloc.so.2")
    with pytest.raises(SystemExit, match="no such file"):
        preload_command(["x"], {ENV: str(tmp_path / "missing.so")}, dirs)


@pytest.mark.parametrize("choice", ["system", "default"])
def test_the_command_line_runs_on_the_chosen_allocator(choice):
    """End to end through ``python -m convs2s``: the speed table's header names the allocator the
    process ran on: glibc's with CONVS2S_ALLOCATOR=system, else tcmalloc/jemalloc where installed."""
    import os

    env = {k: v for k, v in os.environ.items() if k not in (ENV, "LD_PRELOAD")}
    if choice == "system":
        env[ENV] = "system"
    out = subprocess.run([sys.executable, "-m", "convs2s", "bench", "speed-table", "--arch", "fconv_iwslt_de_en",
                          "--vocab", "64", "--sentences", "1", "--beams", "1", "--backends", "reference",
                          "--repeats", "1", "--threads", "1"], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    lib = find_library()
    expected = "glibc malloc" if choice == "system" or lib is None else \
        ("tcmalloc" if "tcmalloc" in lib else "jemalloc")
    assert f"; {expected}; torch" in out.stdout
