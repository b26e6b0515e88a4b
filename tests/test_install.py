"""Installing convs2s leaves the user's torch as it was (issue 80): no exact pin, a lower bound only.

Each test makes a fresh virtual environment holding a torch, installs this project into it with
pip as a user would (from a copy of the source tree, the C++ build skipped: what is checked is
what pip resolves), and checks the torch that was there is still there, untouched. pip's machine
configuration is ignored (PIP_CONFIG_FILE=/dev/null): this project's machines cap torch's release,
a user's do not. Needs the package index (sacrebleu, sentencepiece, tqdm and the build's setuptools).
"""

import json
import os
import shutil
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.slow


def source_copy(dest: Path) -> Path:
    """What a wheel is built from, without this checkout's build outputs."""
    dest.mkdir()
    skip = shutil.ignore_patterns("__pycache__", "*.so", "*.egg-info", "build", "results", "tests")
    for name in ("pyproject.toml", "setup.py", "README.md", "MANIFEST.in"):
        shutil.copy(REPO / name, dest / name)
    for folder in ("convs2s", "convs2s_kernels", "bench/convs2s_bench"):
        shutil.copytree(REPO / folder, dest / folder, ignore=skip)
    return dest


def fake_torch_wheel(folder: Path, version: str) -> Path:
    """A wheel named torch ``version``: a newer release than these machines can install, as pip sees it."""
    wheel = folder / f"torch-{version}-py3-none-any.whl"
    info = f"torch-{version}.dist-info"
    files = {"torch/__init__.py": f"__version__ = {version!r}\n",
             f"{info}/METADATA": f"Metadata-Version: 2.1\nName: torch\nVersion: {version}\n",
             f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    files[f"{info}/RECORD"] = "".join(f"{name},,\n" for name in files) + f"{info}/RECORD,,\n"
    with zipfile.ZipFile(wheel, "w") as z:
        for name, text in files.items():
            z.writestr(name, text)
    return wheel


def pip(python: Path, *args, check=True):
    env = dict(os.environ, PIP_CONFIG_FILE=os.devnull, CONVS2S_KERNELS_SKIP_CPP_BUILD="1",
               PIP_DISABLE_PIP_VERSION_CHECK="1")
    out = subprocess.run([str(python), "-m", "pip", *args], capture_output=True, text=True, env=env, timeout=600)
    assert not check or out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    return out


def torch_state(python: Path) -> tuple:
    """The installed torch's version and the files its RECORD lists, with their contents."""
    code = ("import importlib.metadata as m, hashlib; d = m.distribution('torch'); "
            "print(d.version); [print(f, hashlib.sha256(f.locate().read_bytes()).hexdigest()) "
            "for f in sorted(d.files, key=str) if f.locate().is_file()]")
    return tuple(subprocess.run([str(python), "-c", code], capture_output=True, text=True, check=True)
                 .stdout.splitlines())


def test_a_newer_torch_is_left_as_it_was(tmp_path):
    venv.create(tmp_path / "venv", with_pip=True)
    python = tmp_path / "venv" / "bin" / "python"
    pip(python, "install", "--no-deps", str(fake_torch_wheel(tmp_path, "2.15.0")))
    before = torch_state(python)
    assert before[0] == "2.15.0"
    pip(python, "install", str(source_copy(tmp_path / "src")))
    assert torch_state(python) == before  # the same release, the same files
    listed = pip(python, "list", "--format", "json").stdout
    names = {p["name"].lower(): p["version"] for p in json.loads(listed)}
    assert names["convs2s"] == "0.1.0" and names["torch"] == "2.15.0"
    assert "ninja" not in names and "pybind11" not in names  # build tools, not run-time dependencies


def test_the_installed_torch_is_kept(tmp_path):
    """This machine's torch (2.13.0, a CPU build; a GPU machine's CUDA build likewise): pip plans no torch."""
    import torch

    venv.create(tmp_path / "venv", with_pip=True, system_site_packages=True)
    python = tmp_path / "venv" / "bin" / "python"
    report = tmp_path / "report.json"
    pip(python, "install", "--dry-run", "--report", str(report), str(source_copy(tmp_path / "src")))
    planned = {item["metadata"]["name"].lower(): item["metadata"]["version"]
               for item in json.loads(report.read_text())["install"]}
    assert "convs2s" in planned
    assert "torch" not in planned, f"pip would replace torch {torch.__version__} with {planned.get('torch')}"


def test_an_isolated_build_says_how_to_build_against_the_installed_torch(tmp_path):
    """Without --no-build-isolation the build cannot see torch: one line says what to run."""
    venv.create(tmp_path / "venv", with_pip=True)
    python = tmp_path / "venv" / "bin" / "python"
    env = dict(os.environ, PIP_CONFIG_FILE=os.devnull, PIP_DISABLE_PIP_VERSION_CHECK="1")
    env.pop("CONVS2S_KERNELS_SKIP_CPP_BUILD", None)
    out = subprocess.run([str(python), "-m", "pip", "install", "--no-deps", str(source_copy(tmp_path / "src"))],
                         capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode != 0
    assert "--no-build-isolation" in out.stdout + out.stderr


def test_an_untested_torch_is_named_in_one_line():
    from convs2s_kernels.extension import TESTED_TORCH, untested_torch

    assert untested_torch(f"{TESTED_TORCH[0]}.0+cpu") is None and untested_torch(f"{TESTED_TORCH[-1]}.1") is None
    line = untested_torch("2.99.0+cu130")
    assert "2.99.0+cu130" in line and TESTED_TORCH[0] in line and "\n" not in line
    out = subprocess.run([sys.executable, "-c", "import torch; torch.__version__ = '2.99.0'; import convs2s_kernels"],
                         capture_output=True, text=True, cwd=REPO)
    assert out.returncode == 0, out.stderr
    assert [line for line in out.stderr.splitlines() if "UntestedTorchWarning" in line] == out.stderr.splitlines()[:1]
    assert "2.99.0" in out.stderr
