"""Environment report: ``python3 -m convs2s_kernels.report`` prints versions, the machine's
instruction sets, what the kernel choice has measured, and which backends run here."""

from __future__ import annotations

import platform

from .env import cpu_model, instruction_sets, isa_caps, math_libraries, native_bf16


def kernel_choice_line() -> str:
    """How many weight shapes have their few-row kernel vs GEMM choice measured on this machine."""
    from . import tune_cache

    path = tune_cache.cache_path()
    n = len(tune_cache.load()) if path.exists() else 0
    if n == 0:
        return (f"kernel choice: nothing measured here yet (a model measures its shapes the first time it decodes; "
                f"python3 -m convs2s_kernels.tune; cache {path})")
    return f"kernel choice: {n} weight shapes measured on this machine (python3 -m convs2s_kernels.tune shows them; {path})"


def report() -> str:
    import torch

    import convs2s_kernels as ck

    lines = [
        f"convs2s_kernels {ck.__version__}",
        f"python {platform.python_version()}, torch {torch.__version__}, threads {torch.get_num_threads()}",
        f"cpu: {cpu_model()}, CUDA available: {torch.cuda.is_available()}",
        f"instruction sets: {', '.join(instruction_sets()) or 'unknown'}"
        + (f" (capped: {', '.join(f'{k}={v}' for k, v in isa_caps().items())})" if isa_caps() else ""),
        "bf16 dot products: " + (f"native ({native_bf16()})" if native_bf16() else
                                 "not native (no AVX512-BF16/AMX, or capped); which format is faster here is "
                                 "measured per model (convs2s --compute-type auto)"),
        "math libraries: " + (", ".join(f"{k} {v}" for k, v in math_libraries().items()) or "unknown"),
    ]
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        lines.append(f"gpu: {p.name}, compute capability {p.major}.{p.minor}")
    try:
        import triton

        lines.append(f"triton {triton.__version__}")
    except ImportError:
        lines.append("triton: not installed")
    from .extension import int8_kernel_isa, small_gemm_isa

    if small_gemm_isa() is not None:
        lines.append(f"cpp few-row kernels: {small_gemm_isa()}")
        isa = int8_kernel_isa()
        seven = ("; 7-bit activations (int7 compute types): 3 instructions per 32 multiply-adds instead of 4 in the packed "
                 "kernel (the packed int8 weights of a quantised decoder or encoder), the reducing one as with 8 bits"
                 if isa == "avx2" else "; 7-bit activations (int7 compute types) are no faster here, only coarser")
        lines.append(f"cpp int8 x int8 kernels (linear_w8a8): {isa}" + (seven if isa != "baseline" else ""))
        lines.append(kernel_choice_line())
    lines.append("backends:")
    for name, why in ck.available_backends().items():
        lines.append(f"  {name:<9} {'available' if why is None else 'unavailable: ' + why}")
    return "\n".join(lines)


if __name__ == "__main__":
    print(report())
