import os
import sys
import tempfile
from pathlib import Path

import pytest
import torch

# Before convs2s_kernels is imported: without a GPU the Triton kernels run in the interpreter
# (they are decorated in that mode at import), and every buffer the kernels allocate starts as
# NaN so an element a kernel forgets to write fails the comparison.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
else:  # on GPUs the tests compile one config per kernel (the smallest tile), not the whole tuning space
    os.environ.setdefault("CONVS2S_TRITON_AUTOTUNE", "0")
os.environ.setdefault("CONVS2S_KERNELS_POISON", "1")
# Kernel choice: no timing inside the tests (a choice that moves with the machine's load would
# make results move too); shapes never measured take the few-row kernels up to 8 rows, and the
# tests of the choice itself (tests/test_tune.py) measure into a temporary cache, never the user's.
os.environ.setdefault("CONVS2S_TUNE", "0")
if "CONVS2S_TUNE_CACHE" not in os.environ:
    _TUNE_CACHE = tempfile.TemporaryDirectory(prefix="convs2s-tune-")  # removed when the session ends
    os.environ["CONVS2S_TUNE_CACHE"] = _TUNE_CACHE.name

# Under pytest-xdist (scripts/test.sh runs a worker a core) each worker's torch takes its share of
# the cores, not all of them: two workers of two threads each on two cores would contend.
if os.environ.get("PYTEST_XDIST_WORKER"):
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))))

# Under the interpreter, triton.language is patched once a process, not at every launch and nested
# helper call (convs2s_kernels.testing.patch_interpreter_once; the kernels compute the same).
from convs2s_kernels.testing import patch_interpreter_once  # noqa: E402

patch_interpreter_once()

# the op tests' shared harness (tests/ops/harness.py) is importable from every test module
sys.path.insert(0, str(Path(__file__).resolve().parent / "ops"))

REPO = Path(__file__).resolve().parent.parent
SHARED = Path(os.environ.get("CONVS2S_SHARED", REPO.parent / "shared"))
FIXTURE = SHARED / "fixtures" / "fairseq"


def require_shared(path: Path) -> Path:
    """Skip (with the reason) when ../shared is absent, as on a user's fresh clone."""
    if not path.exists():
        pytest.skip(f"{path} not found: this test reads the project's shared data (../shared, or set CONVS2S_SHARED)")
    return path


@pytest.fixture
def fixture_dir() -> Path:
    return require_shared(FIXTURE)


@pytest.fixture(autouse=True)
def _nan_poisoned_buffers(request):
    """In the op tests (tests/ops/), every uninitialised buffer (``torch.empty`` here and
    ``at::empty`` in the C++ kernels) starts as NaN, so an output element a kernel forgets to
    write shows up; the Triton kernels' buffers are poisoned by ``CONVS2S_KERNELS_POISON``."""
    if request.node.path.parent.name != "ops":
        yield
        return
    import torch.utils.deterministic as det

    was_on, was_fill = torch.are_deterministic_algorithms_enabled(), det.fill_uninitialized_memory
    torch.use_deterministic_algorithms(True, warn_only=True)
    det.fill_uninitialized_memory = True
    yield
    torch.use_deterministic_algorithms(was_on)
    det.fill_uninitialized_memory = was_fill


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(1234)
    yield


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU; none on this machine")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


def tiny_fconv(width: int, decoder_layers: int, vocab: int):
    """A small fconv for decoding tests: 2 encoder layers and ``decoder_layers`` of ``width``
    channels, kernel 3, weight norm folded, in eval mode, seeded."""
    import convs2s

    torch.manual_seed(0)
    return convs2s.build_model("fconv", vocab, vocab, encoder_embed_dim=width, decoder_embed_dim=width,
                               decoder_out_embed_dim=width, encoder_layers=f"[({width}, 3)] * 2",
                               decoder_layers=f"[({width}, 3)] * {decoder_layers}", dropout=0.0
                               ).fold_weight_norm().eval()


@pytest.fixture
def fake_fairseq(tmp_path, monkeypatch):
    """``make(script)``: a stand-in fairseq interpreter (an executable that runs ``script`` with
    this Python) and the file its requests are logged to (``FAKE_FAIRSEQ_LOG``), for the
    ``bench vs-fairseq`` commands' tests: fairseq is a peer, never installed with convs2s."""
    def make(script: str):
        path = tmp_path / "fake_fairseq.py"
        path.write_text(script)
        python = tmp_path / "python"
        python.write_text(f"#!/bin/sh\nexec {sys.executable} {path} \"$@\"\n")
        python.chmod(0o755)
        log = tmp_path / "requests.jsonl"
        monkeypatch.setenv("FAKE_FAIRSEQ_LOG", str(log))
        return python, log

    return make


def free_port() -> int:
    """A loopback port nothing listens on now (for a torchrun rendezvous in a test)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tagged_pids(tag: str, rank: int):
    """The pids of the processes a torchrun launched with CONVS2S_TEST_TAG=tag in its environment
    started with RANK=rank (its workers, not the agent): the one a fault test kills."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            env = dict(v.split("=", 1) for v in (proc / "environ").read_bytes().decode().split("\0") if "=" in v)
        except (OSError, ValueError):
            continue
        if env.get("CONVS2S_TEST_TAG") == tag and env.get("RANK") == str(rank):
            found.append(int(proc.name))
    return found
