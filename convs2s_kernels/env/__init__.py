"""Facts about the machine the kernels run on: CPU model and flags, the caps on its instruction sets,
native bf16, math libraries, cache size, allocator; one description of it for every benchmark
(:func:`machine_description`). The printed report is :mod:`convs2s_kernels.report`, which
``python3 -m convs2s_kernels.env`` prints too (:mod:`.__main__`)."""

from __future__ import annotations

import os
import platform
import re
from typing import Dict, List, Optional

from ..extension import KERNELS_ISA_ENV

# /proc/cpuinfo flags that decide which kernels are fast, and their usual names
ISA_FLAGS = {"avx2": "AVX2", "fma": "FMA", "avx512f": "AVX-512", "avx512_vnni": "AVX512-VNNI",
             "avx_vnni": "AVX-VNNI", "avx512_bf16": "AVX512-BF16", "amx_bf16": "AMX-BF16", "amx_int8": "AMX-INT8"}
# oneDNN's ISA caps (ONEDNN_MAX_CPU_ISA), lowest first; a cap below AVX512_CORE_BF16 hides native bf16
_ONEDNN_ISA_ORDER = ["SSE41", "AVX", "AVX2", "AVX2_VNNI", "AVX2_VNNI_2", "AVX512_CORE", "AVX512_CORE_VNNI",
                     "AVX512_CORE_BF16", "AVX10_1_512", "AVX512_CORE_FP16", "AVX512_CORE_AMX", "AVX512_CORE_AMX_FP16"]
# The caps that make an AVX-512 machine behave like an AVX2-only one: oneDNN's, MKL's, ATen's, and
# this package's own few-row kernels (``CONVS2S_KERNELS_ISA``: amx | avx512 | avx2 | baseline).
CAP_VARIABLES = ("ONEDNN_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS", "ATEN_CPU_CAPABILITY", KERNELS_ISA_ENV)


def cpuinfo_field(field: str) -> Optional[str]:
    """The first ``field`` line of ``/proc/cpuinfo``, None where there is none."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(field):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def cpu_flags() -> List[str]:
    """The instruction-set flags this CPU reports (``/proc/cpuinfo``), empty where unreadable."""
    return (cpuinfo_field("flags") or "").split()


def isa_caps() -> Dict[str, str]:
    """The ISA caps set in the environment (oneDNN, MKL, ATen), as set."""
    return {v: os.environ[v] for v in CAP_VARIABLES if os.environ.get(v)}


def instruction_sets() -> List[str]:
    """The performance-relevant instruction sets the CPU has, by their usual names."""
    flags = set(cpu_flags())
    return [name for flag, name in ISA_FLAGS.items() if flag in flags]


def native_bf16() -> Optional[str]:
    """Why bf16 math is native here (``"AMX-BF16"`` or ``"AVX512-BF16"``), or None when it is not:
    the CPU lacks bf16 dot products, or ``ONEDNN_MAX_CPU_ISA`` caps oneDNN below them."""
    flags = set(cpu_flags())
    cap = os.environ.get("ONEDNN_MAX_CPU_ISA", "").upper()
    if cap and cap not in ("ALL", "DEFAULT"):
        rank = _ONEDNN_ISA_ORDER.index(cap) if cap in _ONEDNN_ISA_ORDER else -1
        if rank < _ONEDNN_ISA_ORDER.index("AVX512_CORE_BF16"):
            return None
        if rank < _ONEDNN_ISA_ORDER.index("AVX512_CORE_AMX"):
            flags.discard("amx_bf16")
    if "amx_bf16" in flags:
        return "AMX-BF16"
    if "avx512_bf16" in flags:
        return "AVX512-BF16"
    return None


def math_libraries() -> Dict[str, str]:
    """Versions of the GEMM libraries torch was built with (MKL, oneDNN), from its build config."""
    import torch

    config = torch.__config__.show()
    out = {}
    m = re.search(r"Math Kernel Library Version ([\w.]+)", config)
    if m:
        out["mkl"] = m.group(1)
    m = re.search(r"MKL-DNN (v[\w.]+)", config)
    if m:
        out["onednn"] = m.group(1)
    return out


def last_level_cache_bytes() -> int:
    """Size of the largest CPU cache (sysfs), 0 where unknown: bandwidth benchmarks use buffers
    well beyond it so that they measure memory, not cache."""
    best = 0
    base = "/sys/devices/system/cpu/cpu0/cache"
    try:
        entries = os.listdir(base)
    except OSError:
        return 0
    for entry in entries:
        try:
            with open(os.path.join(base, entry, "size")) as f:
                text = f.read().strip()
        except OSError:
            continue
        m = re.fullmatch(r"(\d+)([KMG]?)", text)
        if m:
            best = max(best, int(m.group(1)) * {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}[m.group(2)])
    return best


def machine_description(device=None) -> Dict[str, object]:
    """One description of the machine for every benchmark: CPU, instruction sets, caps, threads,
    library versions and, on CUDA devices, the GPU."""
    import torch

    from ..extension import int8_kernel_isa, small_gemm_isa

    info: Dict[str, object] = dict(cpu=cpu_model(), isa=instruction_sets(), isa_caps=isa_caps(),
                                   kernels=dict(few_rows=small_gemm_isa(), int8=int8_kernel_isa()),
                                   allocator=active_allocator(),
                                   native_bf16=native_bf16(), threads=torch.get_num_threads(),
                                   torch=torch.__version__, python=platform.python_version(),
                                   last_level_cache_mb=round(last_level_cache_bytes() / (1 << 20), 1),
                                   **math_libraries())
    if device is not None:
        info["device"] = str(device)
    if device is not None and torch.device(device).type == "cuda":
        p = torch.cuda.get_device_properties(device)
        info.update(gpu=p.name, compute_capability=f"{p.major}.{p.minor}")
    return info


def active_allocator() -> str:
    """The malloc this process runs on: a preloaded tcmalloc or jemalloc, or glibc's."""
    try:
        with open("/proc/self/maps") as f:
            maps = f.read()
    except OSError:
        return "unknown"
    return next((k for k in ("tcmalloc", "jemalloc") if k in maps), "glibc malloc")


def cpu_model() -> str:
    return cpuinfo_field("model name") or platform.processor() or platform.machine()
