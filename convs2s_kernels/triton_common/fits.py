"""The rule every Triton config must pass on a GPU target, and the autotuners' run-time pruning by it.

A config is kept on a target when it can launch there and is worth compiling:

* its shared memory fits the target's opt-in maximum per block (sm_80, A100: 163 KB = 166,912 B;
  sm_90, H100: 227 KB = 232,448 B);
* ptxas spills nothing (no spill stores or loads: a kernel that spills runs from local memory);
* it compiles in at most :data:`MAX_COMPILE_S` seconds of CPU time (the autotuner compiles every
  config of every new key on the first call, on the host).

``python3 -m convs2s_kernels.gpu_check`` compiles every (kernel, config, dtype, target) ahead of
time on the CPU, applies :func:`violations` and writes the committed report
(``convs2s_kernels/gpu_check_report.json``). At run time, on a GPU, each ``@triton.autotune``
prunes its configs with :func:`prune_by_report`: the same rule applied to the report's numbers and
to the device's own shared-memory limit, so a config is never compiled where it cannot run.

This module imports neither torch's CUDA state nor the kernels: the checker and the tests use it
on machines without a GPU.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple

# Opt-in shared memory per block (cudaDevAttrMaxSharedMemoryPerBlockOptin), bytes, for the targets
# the checker compiles for; other capabilities are listed for the run-time pruning.
SHARED_LIMITS: Dict[str, int] = {"sm_80": 166912, "sm_90": 232448}
_OTHER_LIMITS: Dict[Tuple[int, int], int] = {(8, 6): 101376, (8, 7): 166912, (8, 9): 101376,
                                             (10, 0): 232448, (12, 0): 101376}
MAX_COMPILE_S = 20.0

PACKAGE = Path(__file__).resolve().parent.parent
REPORT_PATH = PACKAGE / "gpu_check_report.json"
# the modules whose kernels are checked, and the sources each one's compiled code depends on
KERNEL_MODULES: Dict[str, Tuple[str, ...]] = {
    "conv_glu": ("ops/conv_glu/triton_kernels.py", "triton_common/glu.py", "triton_common/config.py"),
    "attention_embsum": ("ops/attention_embsum/triton_kernels.py", "triton_common/config.py"),
    "conv_step": ("ops/conv_step/triton_kernels.py", "triton_common/glu.py", "triton_common/config.py"),
    "attention_step": ("ops/attention_step/triton_kernels.py", "ops/attention_embsum/triton_kernels.py",
                       "triton_common/config.py"),
    "beam_candidates": ("ops/beam_candidates/triton_kernels.py", "triton_common/config.py"),
    "beam_update": ("ops/beam_update/triton_kernels.py", "triton_common/config.py"),
}


def shared_limit(target: str) -> int:
    """Bytes of shared memory one block may use on ``target`` ("sm_80", "sm_90")."""
    try:
        return SHARED_LIMITS[target]
    except KeyError:
        raise ValueError(f"unknown target {target!r}; the checked targets are {sorted(SHARED_LIMITS)}") from None


def violations(shared_bytes: int, spill_bytes: int, compile_s: Optional[float], target: str = "sm_90",
               limit: Optional[int] = None) -> List[str]:
    """Why a config fails on ``target`` (empty when it fits). ``limit`` overrides the target's
    shared-memory limit (the run-time pruning passes the device's own); ``compile_s`` None skips
    the compile-time part of the rule."""
    limit = shared_limit(target) if limit is None else limit
    out = []
    if shared_bytes > limit:
        out.append(f"shared memory {shared_bytes} B > {limit} B ({target})")
    if spill_bytes > 0:
        out.append(f"spills {spill_bytes} B")
    if compile_s is not None and compile_s > MAX_COMPILE_S:
        out.append(f"compile {compile_s:.1f} s > {MAX_COMPILE_S:.0f} s")
    return out


def config_fits(shared_bytes: int, spill_bytes: int, compile_s: Optional[float], target: str = "sm_90",
                limit: Optional[int] = None) -> bool:
    """The rule: shared memory within the target's limit, no spills, compile within the limit."""
    return not violations(shared_bytes, spill_bytes, compile_s, target, limit)


def row_violations(row: Dict[str, Any], limit: Optional[int] = None) -> List[str]:
    """:func:`violations` of one report row (compile failures included)."""
    if row.get("error"):
        return [f"compile failed: {row['error']}"]
    return violations(row["shared"], row["spill_stores"] + row["spill_loads"], row["compile_s"],
                      row["target"], limit)


def config_id(config) -> str:
    """A config's name in the report: its block sizes, warps and stages, e.g.
    ``BLOCK_M=128 BLOCK_N=64 BLOCK_K=32 w4 s4`` (``config`` a ``triton.Config``)."""
    blocks = " ".join(f"{k}={v}" for k, v in config.kwargs.items())
    return f"{blocks} w{config.num_warps} s{config.num_stages}"


def source_hashes(root: Path = PACKAGE) -> Dict[str, str]:
    """sha256 of each kernel module's sources (what its compiled code depends on)."""
    out = {}
    for module, files in KERNEL_MODULES.items():
        h = hashlib.sha256()
        for rel in files:
            h.update(rel.encode() + b"\0" + (root / rel).read_bytes() + b"\0")
        out[module] = h.hexdigest()
    return out


@functools.lru_cache(maxsize=None)
def load_report(path: str = str(REPORT_PATH)) -> Optional[Dict[str, Any]]:
    """The committed report, or None when it is absent or unreadable."""
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None


def dtype_label(dtype, precision: str) -> str:
    """The report's dtype names: bf16, fp16, fp32-ieee, fp32-tf32 (fp64 for the interpreter)."""
    name = {"torch.bfloat16": "bf16", "torch.float16": "fp16", "torch.float32": "fp32",
            "torch.float64": "fp64"}.get(str(dtype), str(dtype))
    return f"fp32-{precision}" if name == "fp32" else name


def report_target(capability: Tuple[int, int]) -> Optional[str]:
    """The checked target whose numbers hold for a device of ``capability``: sm_80 for Ampere and
    Ada (8.x: same code generation), sm_90 for Hopper; None elsewhere (no numbers)."""
    if capability[0] == 8:
        return "sm_80"
    if capability[0] == 9:
        return "sm_90"
    return None


def device_shared_limit(device=None) -> Tuple[Tuple[int, int], int]:
    """(capability, opt-in shared memory per block in bytes) of the current CUDA device."""
    import torch

    cap = tuple(torch.cuda.get_device_capability(device))
    limit = getattr(torch.cuda.get_device_properties(device), "shared_memory_per_block_optin", None)
    if not limit:
        limit = SHARED_LIMITS.get(f"sm_{cap[0]}{cap[1]}") or _OTHER_LIMITS.get(cap, 101376)
    return cap, int(limit)


def prune_configs(configs: Iterable, kernel: str, dtype: str, target: Optional[str], limit: Optional[int],
                  report: Optional[Dict[str, Any]], key: Callable[[Any], str] = None) -> List:
    """``configs`` less those the report's rows (for ``kernel``, ``dtype``, ``target``, any call
    site) fail by :func:`violations` with shared-memory limit ``limit`` (None: the target's).
    A config without rows is kept (no numbers: the autotuner still skips one that runs out of
    resources). Never empty: when every config fails, the one with the least shared memory is
    kept (``gpu_check`` fails on such a kernel). ``key`` names a config (:func:`config_id`)."""
    key = key or config_id
    configs = list(configs)
    if report is None or target is None:
        return configs
    by_config: Dict[str, List[Dict[str, Any]]] = {}
    for row in report.get("rows", ()):
        if row["kernel"] == kernel and row["dtype"] == dtype and row["target"] == target:
            by_config.setdefault(row["config"], []).append(row)
    kept = [c for c in configs if not any(row_violations(r, limit) for r in by_config.get(key(c), ()))]
    if kept or not configs:
        return kept
    return [min(configs, key=lambda c: max((r.get("shared", 0) for r in by_config.get(key(c), ())), default=0))]


@functools.lru_cache(maxsize=None)
def runtime_report() -> Optional[Dict[str, Any]]:
    """The report the autotuners prune by: the committed one when this Triton made it (its numbers
    are that compiler's), else None, with a warning (configs then go unpruned)."""
    import warnings

    import triton

    report = load_report()
    if report is None:
        warnings.warn(f"{REPORT_PATH} is missing: the Triton autotuners cannot prune their configs")
    elif report.get("triton") != triton.__version__:
        warnings.warn(f"{REPORT_PATH.name} was made with triton {report.get('triton')}, this is "
                      f"{triton.__version__}: the autotuners do not prune by it (regenerate it with "
                      "`python3 -m convs2s_kernels.gpu_check --write-report`)")
        return None
    return report


AUTOTUNE_ENV = "CONVS2S_TRITON_AUTOTUNE"


def prune_by_report(kernel: str) -> Dict[str, Callable]:
    """``prune_configs_by`` for ``@triton.autotune`` of ``kernel`` ("module/function"): drops, on
    the current device, the configs the committed report says break the rule there. The
    autotuner calls it (GPUs only) before compiling the configs of a new key. With
    ``CONVS2S_TRITON_AUTOTUNE=0`` (the GPU tests set it) only the last kept config, the smallest
    tile, is compiled: tests prove the kernels, not the tuning, and compile a fraction."""

    def early_config_prune(configs, named_args, **kwargs):
        dtype = next((a.dtype for a in named_args.values() if hasattr(a, "dtype")), None)
        label = dtype_label(dtype, kwargs.get("PRECISION", "ieee"))
        device = next((a.device for a in named_args.values() if hasattr(a, "device")), None)
        cap, limit = device_shared_limit(device)
        kept = prune_configs(configs, kernel, label, report_target(cap), limit, runtime_report())
        return kept[-1:] if os.environ.get(AUTOTUNE_ENV) == "0" else kept

    return {"early_config_prune": early_config_prune}
