"""Shared benchmark plumbing: machine info, measured peaks, availability checks."""

import os

import pytest
import torch

from convs2s_bench.harness import DTYPES, SMOKE

# The CI smoke run (tiny shapes, no timing) runs the Triton cases in the interpreter when there is
# no GPU, so they are at least executed; this must happen before convs2s_kernels is imported.
if SMOKE and not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
if SMOKE:  # the smoke run times nothing: no kernel-choice measuring either (shapes take the default)
    os.environ.setdefault("CONVS2S_TUNE", "0")

import convs2s_kernels as ck  # noqa: E402

from convs2s_kernels.testing import patch_interpreter_once  # noqa: E402

patch_interpreter_once()  # as tests/conftest.py: under the interpreter, triton.language patched once a process
from convs2s_kernels.env import machine_description  # noqa: E402
from convs2s_kernels.testing import REQUIRE_ENV, required_backends  # noqa: E402

from convs2s_bench.roofline import measure_peaks  # noqa: E402


def pytest_benchmark_update_machine_info(config, machine_info):
    """The one machine description (as the speed table and vs-fairseq record it) under ``machine``,
    its fields under the names bench compare and earlier results read, and the software versions."""
    import convs2s

    machine = machine_description("cuda" if torch.cuda.is_available() else "cpu")
    machine_info["machine"] = machine
    machine_info["cpu_model"] = machine["cpu"]
    machine_info["torch_threads"] = machine["threads"]
    machine_info["torch"] = machine["torch"]
    machine_info["python"] = machine["python"]
    machine_info["convs2s"] = convs2s.__version__
    machine_info["convs2s_kernels"] = ck.__version__
    machine_info["backends"] = {k: v or "available" for k, v in ck.available_backends().items()}
    try:
        import triton

        machine_info["triton"] = triton.__version__
    except ImportError:
        machine_info["triton"] = None
    if "gpu" in machine:
        machine_info["gpu_name"] = machine["gpu"]
        machine_info["gpu_cc"] = machine["compute_capability"]
        machine_info["cuda"] = torch.version.cuda
        try:
            machine_info["gpu_driver"] = torch.cuda.driver_version() if hasattr(torch.cuda, "driver_version") \
                else None
        except Exception:  # noqa: BLE001 - informational only
            machine_info["gpu_driver"] = None


@pytest.fixture(scope="session")
def device():
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


@pytest.fixture(scope="session")
def peaks(request, device):
    """The GEMM peak per dtype (and int8: 8- and 7-bit activations, and 7-bit activations and
    weights, on CPUs) and the copy bandwidth, measured once in this session."""
    disabled = request.config.getoption("benchmark_disable", default=False)
    cpu = device.type == "cpu"
    return measure_peaks(device, dtypes=tuple(DTYPES.values()), small=SMOKE or disabled, int8=cpu, int7=cpu,
                         w7a7=cpu)


@pytest.fixture
def runnable():
    """Skip a case its backend cannot run (with the reasons), but fail it when the backend is
    missing altogether and ``CONVS2S_REQUIRE_BACKENDS`` names it (CI: a broken build goes red)."""
    def check(backend, op, *args, **kwargs):
        missing = ck.available_backends().get(backend)
        if missing is not None and backend in required_backends():
            pytest.fail(f"the {backend} backend is required ({REQUIRE_ENV}) but unavailable: {missing}")
        first = args[0] if isinstance(args[0], torch.Tensor) else args[0][0]  # a list: nag_step's parameters
        why = ck.backend_reasons(backend, op, first.device, *args, **kwargs)
        if why:
            pytest.skip(f"{backend} cannot run {op} here: {'; '.join(why)}")

    return check
