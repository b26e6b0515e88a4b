"""Shared benchmark plumbing: machine info, thread count, and roofline numbers in extra_info."""

import platform

import pytest
import torch

import convs2s_kernels as ck
from convs2s_kernels.env import cpu_model


def pytest_benchmark_update_machine_info(config, machine_info):
    machine_info["cpu_model"] = cpu_model()
    machine_info["torch_threads"] = torch.get_num_threads()
    machine_info["torch"] = torch.__version__
    machine_info["convs2s_kernels"] = ck.__version__
    machine_info["backends"] = {k: v or "available" for k, v in ck.available_backends().items()}
    machine_info["python"] = platform.python_version()
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        machine_info["gpu_name"] = p.name
        machine_info["gpu_cc"] = f"{p.major}.{p.minor}"


@pytest.fixture
def runnable():
    def check(backend, op, *args):
        why = ck.dispatch.reasons(backend, op, args[0].device, *args)
        if why:
            pytest.skip(f"{backend} cannot run {op} here: {'; '.join(why)}")

    return check
