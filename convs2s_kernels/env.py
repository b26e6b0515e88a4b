"""Environment report: ``python -m convs2s_kernels.env`` prints versions and which backends run here."""

from __future__ import annotations

import platform


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def report() -> str:
    import torch

    import convs2s_kernels as ck

    lines = [
        f"convs2s_kernels {ck.__version__}",
        f"python {platform.python_version()}, torch {torch.__version__}, threads {torch.get_num_threads()}",
        f"cpu: {cpu_model()}, CUDA available: {torch.cuda.is_available()}",
    ]
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        lines.append(f"gpu: {p.name}, compute capability {p.major}.{p.minor}")
    try:
        import triton

        lines.append(f"triton {triton.__version__}")
    except ImportError:
        lines.append("triton: not installed")
    try:
        from . import _C

        lines.append(f"cpp few-row kernels: {_C.small_gemm_isa()}")
    except ImportError:
        pass
    lines.append("backends:")
    for name, why in ck.available_backends().items():
        lines.append(f"  {name:<9} {'available' if why is None else 'unavailable: ' + why}")
    return "\n".join(lines)


if __name__ == "__main__":
    print(report())
