"""Compiling one job for a GPU target on the CPU and reading what it needs: shared memory
(``metadata.shared``), registers and stack (``cuobjdump --dump-resource-usage``), spills (ptxas
``-v``), the tensor-core instructions its SASS holds (``cuobjdump -sass``) and CPU seconds; the
CUDA tools the Triton wheel ships; the pool of compile processes."""

from __future__ import annotations

import contextlib
import io
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

from ..triton_common.fits import row_violations
from .jobs import Job
from .launches import config_name, kernels_module

HARD_TIMEOUT_S = 300  # a compile still running after this is recorded as failed


# --- the CUDA tools and their output -------------------------------------------------------------

_RESOURCE_RE = re.compile(r"Function\s+(\S+?):\s*\n\s*REG:(\d+)\s+STACK:(\d+)\s+SHARED:(\d+)\s+LOCAL:(\d+)")
_PTXAS_SPILL_RE = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_PTXAS_REG_RE = re.compile(r"Used (\d+) registers")


def parse_resource_usage(text: str) -> Dict[str, Dict[str, int]]:
    """``cuobjdump --dump-resource-usage`` output -> {function: {registers, stack, shared, local}}
    (``shared`` there is the static shared memory only; Triton's is dynamic, see ``metadata.shared``)."""
    out = {}
    for m in _RESOURCE_RE.finditer(text):
        out[m.group(1)] = dict(registers=int(m.group(2)), stack=int(m.group(3)), shared=int(m.group(4)),
                               local=int(m.group(5)))
    return out


def parse_ptxas_log(text: str) -> Optional[Dict[str, int]]:
    """ptxas ``-v`` output -> {stack_frame, spill_stores, spill_loads, registers}; None when it
    has no function properties line."""
    m = _PTXAS_SPILL_RE.search(text)
    if m is None:
        return None
    out = dict(stack_frame=int(m.group(1)), spill_stores=int(m.group(2)), spill_loads=int(m.group(3)))
    r = _PTXAS_REG_RE.search(text)
    if r:
        out["registers"] = int(r.group(1))
    return out


# Tensor-core instructions in SASS, most capable first: warp-group MMA (Hopper's wgmma: HGMMA for
# 16-bit inputs and TF32, IGMMA int8, QGMMA fp8), then the warp-level mma.sync (HMMA, IMMA).
_MMA_FAMILIES = ("HGMMA", "IGMMA", "QGMMA", "HMMA", "IMMA")
_MMA_RE = re.compile(r"\b(" + "|".join(_MMA_FAMILIES) + r")\.")


def tensor_core_ops(sass: str) -> str:
    """The most capable tensor-core instruction family in ``cuobjdump -sass`` output, or ``"-"``
    (no tensor cores: the products run on FMA units)."""
    found = set(_MMA_RE.findall(sass))
    return next((f for f in _MMA_FAMILIES if f in found), "-")


def nvidia_tool(name: str) -> Optional[str]:
    """Path of a CUDA tool the Triton wheel ships (``cuobjdump``, ``ptxas``), or None."""
    try:
        import triton
    except ImportError:
        return None
    path = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / name
    return str(path) if path.exists() else None


def tools_missing() -> Optional[str]:
    """Why the checker cannot run here (None when it can)."""
    try:
        import triton  # noqa: F401
        from triton.backends.compiler import GPUTarget  # noqa: F401
        from triton.compiler import ASTSource  # noqa: F401
    except ImportError as exc:
        return f"triton with its NVIDIA backend is not importable ({exc})"
    for tool in ("ptxas", "cuobjdump"):
        if nvidia_tool(tool) is None:
            return f"the Triton wheel has no {tool} under triton/backends/nvidia/bin"
    return None


# --- compiling ---------------------------------------------------------------------------------

class _Timeout(BaseException):
    """Raised by SIGALRM inside a compile (a BaseException: Triton's own handlers must not eat it)."""


def _on_alarm(signum, frame):
    raise _Timeout()


def _cpu_seconds() -> float:
    import resource

    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def bind(job: Job):
    """(JITFunction, GPUTarget, ASTSource, options) of a job, as ``JITFunction.run`` builds them on
    a GPU: the JIT's own specialization of the launch's arguments (ints equal to 1 become
    constexprs, 16-aligned pointers and multiples of 16 get their divisibility attributes)."""
    from triton import knobs
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, make_backend
    from triton.runtime.jit import create_function_from_signature

    launch = job.launch
    fn = getattr(kernels_module(launch.module), launch.function)
    while not hasattr(fn, "arg_names") or not hasattr(fn, "params"):
        fn = fn.fn  # Autotuner / Heuristics -> JITFunction
    cap = int(job.target.split("_")[1])
    target = GPUTarget("cuda", cap, 32)
    backend = make_backend(target)
    kwargs = dict(launch.kwargs, **job.config)
    # what JITFunction.run adds before binding
    kwargs.setdefault("debug", bool(getattr(fn, "debug", False)) or bool(knobs.runtime.debug))
    for name in ("instrumentation_mode", "fpsan_homomorphic_casts"):
        if hasattr(knobs.compilation, name):
            kwargs.setdefault(name, getattr(knobs.compilation, name))
    binder = create_function_from_signature(fn.signature, fn.params, backend)
    bound, specialization, options = binder(*launch.args, **kwargs)
    options, signature, constexprs, attrs = fn._pack_args(backend, kwargs, bound, specialization, options)
    return fn, target, ASTSource(fn, signature, constexprs, attrs), options


def compile_job(job: Job) -> Dict[str, Any]:
    """Compile one job; its report row (numbers, or the error)."""
    import triton
    from triton import knobs

    launch = job.launch
    row: Dict[str, Any] = dict(kernel=launch.kernel, site=launch.site, config=config_name(job.config),
                               dtype=job.dtype, target=job.target)
    fn, target, source, options = bind(job)
    knobs.nvidia.dump_ptxas_log = True
    log = io.StringIO()
    old = signal.signal(signal.SIGALRM, _on_alarm)
    signal.alarm(HARD_TIMEOUT_S)
    wall0, cpu0 = time.perf_counter(), _cpu_seconds()
    try:
        with contextlib.redirect_stdout(log):
            kernel = triton.compile(source, target=target, options=options.__dict__)
    except _Timeout:
        row.update(error=f"still compiling after {HARD_TIMEOUT_S} s", compile_s=float(HARD_TIMEOUT_S))
        return row
    except Exception as exc:  # a compile error is a finding, not a crash of the checker
        msg = str(exc).strip().splitlines()
        row.update(error=f"{type(exc).__name__}: {msg[-1] if msg else ''}"[:300])
        return row
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    row["compile_s"] = round(_cpu_seconds() - cpu0, 2)
    row["wall_s"] = round(time.perf_counter() - wall0, 2)
    row.update(resources(kernel, log.getvalue()))
    return row


def resources(kernel, ptxas_log: str) -> Dict[str, int]:
    """Shared memory (``metadata.shared``), registers and stack (cuobjdump), spills (ptxas -v)
    and tensor-core instructions (``mma``: :func:`tensor_core_ops`) of a compiled kernel."""
    row = dict(shared=int(kernel.metadata.shared))
    with tempfile.TemporaryDirectory() as tmp:
        cubin = Path(tmp) / "k.cubin"
        cubin.write_bytes(kernel.asm["cubin"])
        dump = subprocess.run([nvidia_tool("cuobjdump"), "--dump-resource-usage", str(cubin)],
                              capture_output=True, text=True, check=True).stdout
        sass = subprocess.run([nvidia_tool("cuobjdump"), "-sass", str(cubin)],
                              capture_output=True, text=True, check=True).stdout
    usage = parse_resource_usage(dump).get(kernel.metadata.name) or next(iter(parse_resource_usage(dump).values()))
    ptxas = parse_ptxas_log(ptxas_log)
    row.update(registers=usage["registers"], stack=usage["stack"], mma=tensor_core_ops(sass))
    if ptxas is not None:
        row.update(spill_stores=ptxas["spill_stores"], spill_loads=ptxas["spill_loads"])
    else:  # no ptxas log: a stack frame in a Triton kernel means spilled registers
        row.update(spill_stores=usage["stack"] + usage["local"], spill_loads=0)
    return row


def _init_worker():
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def run_jobs(jobs: List[Job], n_jobs: int, progress: bool = True) -> List[Dict[str, Any]]:
    """Compile every job (``n_jobs`` processes); rows in the jobs' order."""
    rows: List[Optional[Dict[str, Any]]] = [None] * len(jobs)
    t0 = time.perf_counter()

    def done(i, row):
        rows[i] = row
        if progress:
            n = sum(r is not None for r in rows)
            why = row_violations(row)
            print(f"[{n}/{len(jobs)} {time.perf_counter() - t0:6.0f} s] {row['kernel']}"
                  f"{'[' + row['site'] + ']' if row['site'] else ''} {row['config']} {row['dtype']} {row['target']}: "
                  f"{'ok' if not why else '; '.join(why)} ({row.get('compile_s', 0):.1f} s)",
                  file=sys.stderr, flush=True)

    if n_jobs <= 1 or len(jobs) <= 1:
        for i, job in enumerate(jobs):
            done(i, compile_job(job))
    else:
        import multiprocessing as mp
        from concurrent.futures import ProcessPoolExecutor, as_completed

        # forked workers inherit the imported kernels; each compiles whole jobs, the slowest first
        order = sorted(range(len(jobs)), key=lambda i: (jobs[i].dtype != "fp32-ieee", i))
        with ProcessPoolExecutor(n_jobs, mp_context=mp.get_context("fork"), initializer=_init_worker) as pool:
            futures = {pool.submit(compile_job, jobs[i]): i for i in order}
            for fut in as_completed(futures):
                done(futures[fut], fut.result())
    return rows  # type: ignore[return-value]
