"""Every Triton config checked for the GPU, ahead of time, on a CPU.

``python3 -m convs2s_kernels.gpu_check`` compiles each launch of the package's Triton kernels
(``conv_glu``, ``attention_embsum``, ``conv_step``: forward and backward) for every autotune
config, every dtype the kernels take (bf16, fp16, fp32 with IEEE and with TF32 products) and the
targets sm_80 (A100) and sm_90 (H100) with ``triton.compile`` and a ``GPUTarget``: no GPU or
driver needed. For each it reads the shared memory (``metadata.shared``), the registers and stack
(``cuobjdump --dump-resource-usage`` on the cubin, the wheel ships it), the spill stores and loads
(ptxas ``-v``) and the compile time (CPU seconds, ptxas included), prints a table and applies the
rule of :mod:`convs2s_kernels.triton_common.fits` (shared memory within the target, no spills,
compile <= 20 s): it exits 1 when a config breaks it.

The signature of each launch is the one the kernel's own wrapper passes at the paper's shapes:
the wrappers run on ``meta`` tensors (contiguous, 16-byte aligned, as the model's are) with the
launch intercepted, and the JIT's own specialization turns the arguments into the signature,
constexprs and alignment attributes a GPU run compiles.

Modes:

* default: the whole matrix (``--targets``, ``--dtypes``, ``--kernels`` narrow it);
* ``--write-report``: the whole matrix, written to ``convs2s_kernels/gpu_check_report.json``
  with a hash of each kernel module's sources (the autotuners prune at run time by it);
* ``--ci``: when every module's hash matches the committed report, a small fixed subset only
  (one config per launch, bf16, sm_90, plus one fp32 sm_80 case), checked by the rule and against
  the report's numbers; a module whose sources changed gets its whole matrix and the run fails
  with "report is stale". ``--subset`` compiles that subset without the comparison;
* ``--try LAUNCH:CONFIG``: a candidate config instead of the lists (what a fix is tried with).

Runs in its own process without ``TRITON_INTERPRET`` (the kernels must be decorated as
``JITFunction``s, not for the interpreter): when the variable is set, it re-executes itself
without it.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import io
import json
import os
import platform
import re
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from .atomic_files import atomic_write_text
from .triton_common.fits import (KERNEL_MODULES, MAX_COMPILE_S, REPORT_PATH, SHARED_LIMITS, prune_configs,
                                 row_violations, source_hashes)

TARGETS = ("sm_80", "sm_90")
DTYPES = ("bf16", "fp16", "fp32-ieee", "fp32-tf32")
HARD_TIMEOUT_S = 300  # a compile still running after this is recorded as failed
STALE_MESSAGE = "report is stale: run `python3 -m convs2s_kernels.gpu_check --write-report`"
# what --ci and --subset compile when the report is current: (launch, config index, dtype, target)
SUBSET_DTYPE, SUBSET_TARGET = "bf16", "sm_90"
SUBSET_EXTRA = (("conv_glu/_conv_glu_fwd_kernel", 0, "fp32-ieee", "sm_80"),)


# --- reading the tools' output ----------------------------------------------------------------

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


# --- the launches -------------------------------------------------------------------------------

class _Ptr:
    """A pointer argument as the JIT sees a contiguous tensor: its dtype, a 16-byte aligned address."""

    def __init__(self, dtype):
        self.dtype = dtype

    @staticmethod
    def data_ptr():
        return 0

    def __reduce__(self):
        return (_Ptr, (self.dtype,))


@dataclass
class Launch:
    """One kernel launch of a wrapper: the kernel, where it was launched, its arguments."""

    module: str  # "conv_glu"
    function: str  # "_conv_glu_fwd_kernel": the attribute of ops/<module>/triton_kernels.py
    site: str  # "" or what tells this launch from another of the same kernel ("dq", "decode")
    args: Tuple[Any, ...]
    kwargs: Dict[str, Any]
    configs: List[Dict[str, Any]] = field(default_factory=list)  # Config.all_kwargs() of each

    @property
    def kernel(self) -> str:
        return f"{self.module}/{self.function}"

    @property
    def name(self) -> str:
        return self.kernel + (f"[{self.site}]" if self.site else "")


def _kernels_module(module: str):
    import importlib

    return importlib.import_module(f"convs2s_kernels.ops.{module}.triton_kernels")


def config_name(cfg: Dict[str, Any]) -> str:
    blocks = " ".join(f"{k}={v}" for k, v in cfg.items() if k not in ("num_warps", "num_stages", "num_ctas",
                                                                      "maxnreg", "ir_override"))
    return f"{blocks} w{cfg.get('num_warps', 4)} s{cfg.get('num_stages', 3)}"


def _record_launches(module: str, run: Callable[[], None], sites: Dict[str, List[str]]) -> List[Launch]:
    """Run ``run`` (it calls the module's wrappers on meta tensors) with every kernel launch of the
    module intercepted; ``sites[function]`` names repeated launches of one kernel in order."""
    import torch
    from triton.runtime.autotuner import Autotuner
    from triton.runtime.jit import JITFunction

    mod = _kernels_module(module)
    recorded: List[Launch] = []
    patched = []
    for attr, obj in vars(mod).items():
        if not isinstance(obj, (Autotuner, JITFunction)):
            continue  # (helpers such as _glu_tap_dot are patched too: only launches reach .run)

        def intercept(*args, grid=None, warmup=False, _obj=obj, _attr=attr, **kwargs):
            if isinstance(_obj, Autotuner):
                configs = [c.all_kwargs() for c in _obj.configs]
                _obj.best_config = _obj.configs[0]  # the wrappers may read it after the launch
            else:
                configs = [{k: kwargs.pop(k) for k in ("num_warps", "num_stages") if k in kwargs}]
            n = sum(1 for r in recorded if r.function == _attr)
            names = sites.get(_attr, [])
            site = names[n] if n < len(names) else (str(n) if n else "")
            args = tuple(_Ptr(a.dtype) if isinstance(a, torch.Tensor) else a for a in args)
            recorded.append(Launch(module, _attr, site, args, dict(kwargs), configs))

        obj.run = intercept
        patched.append(obj)
    try:
        run()
    finally:
        for obj in patched:
            del obj.run
    return recorded


def _meta(*shape, dtype):
    import torch

    return torch.empty(*shape, dtype=dtype, device="meta")


def _conv_glu_calls(dtype) -> None:
    """The encoder's call (centred, bias, residual, pad mask, scale): every flag on; k = 3,
    C = 512, 160 sentences x 25 steps."""
    import torch

    from .ops.conv_glu.triton_kernels import conv_glu_backward, conv_glu_forward

    B, T, C, k = 160, 25, 512, 3
    x, res, grad = (_meta(B, T, C, dtype=dtype) for _ in range(3))
    w, b = _meta(k, C, 2 * C, dtype=dtype), _meta(2 * C, dtype=dtype)
    mask = _meta(B, T, dtype=torch.bool)
    conv_glu_forward(x, w, b, res, mask, False, 0.5 ** 0.5)
    conv_glu_backward(grad, x, w, b, mask, False, 0.5 ** 0.5, (True, True, True, True))


def _attention_calls(dtype) -> None:
    """Training (160 x 25 targets over 25 sources, E = 768, left-padded, with the probabilities
    and their gradient) and decoding (T = 1: a different specialization)."""
    import torch

    from .ops.attention_embsum.triton_kernels import attention_backward, attention_forward

    B, T, S, E = 160, 25, 25, 768
    q, dctx = _meta(B, T, E, dtype=dtype), _meta(B, T, E, dtype=dtype)
    z, y = _meta(B, S, E, dtype=dtype), _meta(B, S, E, dtype=dtype)
    lens = _meta(B, dtype=torch.int64)
    out, attn, lse = attention_forward(q, z, y, lens, True, True)
    attention_backward(dctx, _meta(B, T, S, dtype=dtype), q, z, y, lens, True, out, attn, lse, (True, True, True))
    attention_forward(_meta(B * 5, 1, E, dtype=dtype), _meta(B * 5, S, E, dtype=dtype),
                      _meta(B * 5, S, E, dtype=dtype), _meta(B * 5, dtype=torch.int64), True, False)


def _conv_step_calls(dtype) -> None:
    """A decoding step: 128 sentences x beam 5, C = 512, k = 3, with the beam reorder and bias."""
    import torch

    from .ops.conv_step.triton_kernels import conv_step_triton

    N, C, k = 640, 512, 3
    conv_step_triton(_meta(N, C, dtype=dtype), _meta(N, k - 1, C, dtype=dtype), _meta(k, C, 2 * C, dtype=dtype),
                     _meta(2 * C, dtype=dtype), _meta(N, dtype=torch.int64))


_CALLS: Dict[str, Tuple[Callable[[Any], None], Dict[str, List[str]]]] = {
    "conv_glu": (_conv_glu_calls, {}),
    "attention_embsum": (_attention_calls, {"_attention_fwd_kernel": ["", "decode"],
                                            "_bmm_kernel": ["dq", "dz", "dy"]}),
    "conv_step": (_conv_step_calls, {}),
}
assert set(_CALLS) == set(KERNEL_MODULES)


def collect_launches(modules: Sequence[str], dtype_label: str) -> List[Launch]:
    """Every launch of ``modules``' wrappers for one dtype (fp32-tf32: TF32 allowed for matmuls)."""
    import torch

    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(dtype_label, torch.float32)
    matmul = torch.backends.cuda.matmul
    was = matmul.allow_tf32
    matmul.allow_tf32 = dtype_label == "fp32-tf32"
    try:
        out = []
        for module in modules:
            calls, sites = _CALLS[module]
            out += _record_launches(module, lambda: calls(dtype), sites)
        return out
    finally:
        matmul.allow_tf32 = was


# --- compiling one job --------------------------------------------------------------------------

@dataclass
class Job:
    launch: Launch
    config: Dict[str, Any]
    dtype: str
    target: str

    @property
    def key(self) -> Tuple[str, str, str, str]:
        return (self.launch.name, config_name(self.config), self.dtype, self.target)


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
    fn = getattr(_kernels_module(launch.module), launch.function)
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
    """Shared memory (``metadata.shared``), registers and stack (cuobjdump) and spills (ptxas -v)
    of a compiled kernel."""
    row = dict(shared=int(kernel.metadata.shared))
    with tempfile.TemporaryDirectory() as tmp:
        cubin = Path(tmp) / "k.cubin"
        cubin.write_bytes(kernel.asm["cubin"])
        dump = subprocess.run([nvidia_tool("cuobjdump"), "--dump-resource-usage", str(cubin)],
                              capture_output=True, text=True, check=True).stdout
    usage = parse_resource_usage(dump).get(kernel.metadata.name) or next(iter(parse_resource_usage(dump).values()))
    ptxas = parse_ptxas_log(ptxas_log)
    row.update(registers=usage["registers"], stack=usage["stack"])
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


# --- the matrix, the table, the report ------------------------------------------------------------

def build_jobs(modules: Sequence[str], dtypes: Sequence[str], targets: Sequence[str]) -> List[Job]:
    jobs = []
    for dtype in dtypes:
        for launch in collect_launches(modules, dtype):
            for config in launch.configs:
                for target in targets:
                    jobs.append(Job(launch, config, dtype, target))
    return jobs


def subset_jobs(modules: Sequence[str]) -> List[Job]:
    """The fixed CI subset: each launch's first config in bf16 on sm_90, plus :data:`SUBSET_EXTRA`."""
    jobs = [Job(launch, launch.configs[0], SUBSET_DTYPE, SUBSET_TARGET)
            for launch in collect_launches(modules, SUBSET_DTYPE)]
    for name, index, dtype, target in SUBSET_EXTRA:
        for launch in collect_launches([name.split("/")[0]], dtype):
            if launch.name == name and launch.module in modules:
                jobs.append(Job(launch, launch.configs[index], dtype, target))
    return jobs


def parse_try(spec: str) -> Tuple[str, Dict[str, Any]]:
    """``LAUNCH:NAME=V,...`` (``--try``) -> (launch name, config dict with num_warps/num_stages)."""
    launch, _, body = spec.rpartition(":")
    if not launch or not body:
        raise ValueError(f"--try {spec!r}: expected LAUNCH:BLOCK_M=64,...,num_warps=4,num_stages=3")
    cfg: Dict[str, Any] = {}
    for item in body.split(","):
        k, _, v = item.partition("=")
        cfg[k.strip()] = int(v)
    blocks = {k: v for k, v in cfg.items() if k not in ("num_warps", "num_stages")}
    return launch, dict(blocks, num_warps=cfg.get("num_warps", 4), num_stages=cfg.get("num_stages", 3))


def try_jobs(specs: Sequence[str], dtypes: Sequence[str], targets: Sequence[str]) -> List[Job]:
    """Jobs for candidate configs (``--try``): each on the named launch, every dtype and target."""
    jobs = []
    for spec in specs:
        name, cfg = parse_try(spec)
        module = name.split("/")[0]
        if module not in KERNEL_MODULES:
            raise ValueError(f"--try {spec!r}: unknown kernel module {module!r}")
        for dtype in dtypes:
            launch = next((l for l in collect_launches([module], dtype) if l.name == name), None)
            if launch is None:
                names = sorted({l.name for l in collect_launches([module], dtype)})
                raise ValueError(f"--try {spec!r}: no launch {name!r}; {module} has {names}")
            jobs += [Job(launch, cfg, dtype, target) for target in targets]
    return jobs


def row_key(row: Dict[str, Any]) -> Tuple[str, str, str, str]:
    name = row["kernel"] + (f"[{row['site']}]" if row.get("site") else "")
    return (name, row["config"], row["dtype"], row["target"])


def unusable(rows: List[Dict[str, Any]]) -> List[str]:
    """(kernel, dtype, target) groups of ``rows`` left with no config that keeps the rule, as the
    autotuners' run-time pruning (:func:`~convs2s_kernels.triton_common.fits.prune_configs`,
    every call site of a kernel together) sees them."""
    groups: Dict[Tuple[str, str, str], List[str]] = {}
    for r in rows:
        names = groups.setdefault((r["kernel"], r["dtype"], r["target"]), [])
        if r["config"] not in names:
            names.append(r["config"])
    out = []
    for (kernel, dtype, target), names in groups.items():
        kept = prune_configs(names, kernel, dtype, target, None, {"rows": rows}, key=lambda c: c)
        if not kept or any(row_violations(r) for r in rows if r["kernel"] == kernel and r["dtype"] == dtype
                           and r["target"] == target and r["config"] == kept[0]):
            out.append(f"{kernel} {dtype} {target}: no config keeps the rule")
    return out


def format_table(rows: List[Dict[str, Any]]) -> str:
    head = ("kernel", "config", "dtype", "target", "regs", "stack", "spills st/ld", "shared", "compile s", "status")
    lines = []
    for r in rows:
        name = r["kernel"].split("/", 1)[1] + (f"[{r['site']}]" if r.get("site") else "")
        why = row_violations(r)
        status = "ok" if not why else "pruned: " + "; ".join(why)
        if r.get("error"):
            cells = (name, r["config"], r["dtype"], r["target"], "-", "-", "-", "-",
                     f"{r.get('compile_s', 0):.1f}", status)
        else:
            cells = (name, r["config"], r["dtype"], r["target"], str(r.get("registers", "-")),
                     str(r.get("stack", "-")), f"{r['spill_stores']}/{r['spill_loads']}",
                     f"{r['shared'] / 1024:.0f} KB", f"{r['compile_s']:.1f}", status)
        lines.append(cells)
    widths = [max(len(str(c)) for c in col) for col in zip(head, *lines)] if lines else [len(h) for h in head]
    fmt = lambda cells: "  ".join(str(c).ljust(w) for c, w in zip(cells, widths)).rstrip()
    return "\n".join([fmt(head), fmt(["-" * w for w in widths])] + [fmt(c) for c in lines])


def summarize(rows: List[Dict[str, Any]]) -> str:
    """One paragraph: how many compiles, kept and pruned (and why), the compile times."""
    why = [row_violations(r) for r in rows]
    pruned = sum(1 for w in why if w)
    causes = {"shared memory": 0, "spills": 0, "compile": 0, "compile failed": 0}
    for w in why:
        for cause in causes:
            if any(v.startswith(cause) for v in w):
                causes[cause] += 1
    secs = [r.get("compile_s", 0.0) for r in rows]
    text = (f"{len(rows)} compiles: {len(rows) - pruned} keep the rule (shared memory within "
            f"{', '.join(f'{t} {b} B' for t, b in SHARED_LIMITS.items())}, no spills, compile <= "
            f"{MAX_COMPILE_S:.0f} s), {pruned} pruned at run time"
            + (" (" + ", ".join(f"{c}: {n}" for c, n in causes.items() if n) + ")" if pruned else "")
            + f"; compile CPU time {sum(secs):.0f} s in all")
    if rows:
        worst = max(rows, key=lambda r: r.get("compile_s", 0.0))
        text += f", slowest {worst.get('compile_s', 0):.1f} s ({' '.join(row_key(worst))})"
    return text


def _triton_version() -> str:
    import triton

    return triton.__version__


def write_report(path: Path, rows: List[Dict[str, Any]], modules: Sequence[str], seconds: float,
                 n_jobs: int) -> None:
    """Write the report; with only some modules, replace their rows and hashes in the existing one."""
    old: Dict[str, Any] = {}
    if path.exists() and set(modules) != set(KERNEL_MODULES):
        old = json.loads(path.read_text())
    hashes = source_hashes()
    kept_rows = [r for r in old.get("rows", []) if r["kernel"].split("/")[0] not in modules]
    report = dict(
        about=("Every Triton config of convs2s_kernels compiled for sm_80 and sm_90 on a CPU by "
               "`python3 -m convs2s_kernels.gpu_check --write-report`; the autotuners prune at run "
               "time by these rows (convs2s_kernels/triton_common/fits.py). compile_s is CPU seconds "
               "(ptxas included), wall_s the wall time with the other jobs running beside it."),
        triton=_triton_version(),
        limits=dict(SHARED_LIMITS),
        max_compile_s=MAX_COMPILE_S,
        generated=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        machine=f"{platform.machine()}, {os.cpu_count()} CPUs, {n_jobs} compile processes",
        last_run=dict(modules=list(modules), compiles=len(rows), wall_s=round(seconds, 1),
                      compile_cpu_s=round(sum(r.get("compile_s", 0.0) for r in rows), 1)),
        sources={**old.get("sources", {}), **{m: hashes[m] for m in modules}},
        rows=sorted(kept_rows + rows, key=lambda r: (r["kernel"], r["site"], r["dtype"], r["target"], r["config"])),
    )
    atomic_write_text(path, dump_report(report))


def dump_report(report: Dict[str, Any]) -> str:
    """The report as JSON with one line per row (diffs stay readable)."""
    head = json.dumps({k: v for k, v in report.items() if k != "rows"}, indent=1)
    rows = ",\n".join("  " + json.dumps(r) for r in report["rows"])
    return head[:-2] + ',\n "rows": [\n' + rows + "\n ]\n}\n"


def _stale_modules(report: Optional[Dict[str, Any]], modules: Sequence[str]) -> List[str]:
    if report is None:
        return list(modules)
    if report.get("triton") != _triton_version():
        return list(modules)
    hashes = source_hashes()
    return [m for m in modules if report.get("sources", {}).get(m) != hashes[m]]


def ci(report_path: Path, n_jobs: int, modules: Sequence[str]) -> int:
    """CI: the subset against a current report, or the whole matrix of stale modules (and fail)."""
    report = json.loads(report_path.read_text()) if report_path.exists() else None
    stale = _stale_modules(report, modules)
    status = 0
    if stale:
        why = ("no report at " + str(report_path) if report is None else
               f"the report was made with triton {report.get('triton')}, this is {_triton_version()}"
               if report.get("triton") != _triton_version() else
               "sources changed since the report: " + ", ".join(stale))
        print(f"{why}; compiling their whole matrix", file=sys.stderr)
        rows = run_jobs(build_jobs(stale, DTYPES, TARGETS), n_jobs)
        print(format_table(rows))
        print(summarize(rows))
        for line in unusable(rows):
            print(line)
        print(STALE_MESSAGE)
        status = 1
    current = [m for m in modules if m not in stale]
    if not current:
        return status
    assert report is not None
    # the report covers exactly today's configs, and every row in it keeps the rule
    expected = {job.key for job in build_jobs(current, DTYPES, TARGETS)}
    reported = {row_key(r): r for r in report["rows"] if r["kernel"].split("/")[0] in current}
    if set(reported) != expected:
        missing, extra = sorted(expected - set(reported)), sorted(set(reported) - expected)
        print(f"the report's rows do not match the configs: missing {missing[:5]}, extra {extra[:5]}; {STALE_MESSAGE}")
        return 1
    bad = unusable(list(reported.values()))
    if bad:
        print("the report leaves kernels without a usable config (fix or add configs):\n  " + "\n  ".join(bad))
        status = 1
    rows = run_jobs(subset_jobs(current), n_jobs)
    print(format_table(rows))
    for row in rows:
        ref = reported.get(row_key(row))
        if row.get("error") and not (ref or {}).get("error"):
            print(f"{' '.join(row_key(row))}: {row['error']}")
            status = 1
        elif ref is not None:
            diff = [f"{k} {row.get(k)} (report: {ref.get(k)})"
                    for k in ("shared", "registers", "spill_stores", "spill_loads") if row.get(k) != ref.get(k)]
            if diff:
                print(f"{' '.join(row_key(row))}: differs from the report: {', '.join(diff)}; {STALE_MESSAGE}")
                status = 1
    print(summarize(rows) + f"; {len(reported)} report rows checked")
    return status


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python3 -m convs2s_kernels.gpu_check", description=__doc__.split("\n\n")[0])
    parser.add_argument("--targets", default=",".join(TARGETS), help="comma-separated: sm_80,sm_90")
    parser.add_argument("--dtypes", default=",".join(DTYPES), help="comma-separated: " + ",".join(DTYPES))
    parser.add_argument("--kernels", default=",".join(KERNEL_MODULES),
                        help="comma-separated kernel modules: " + ",".join(KERNEL_MODULES))
    parser.add_argument("--report", default=str(REPORT_PATH), help="the report to write or check against")
    parser.add_argument("--write-report", action="store_true", help="compile the whole matrix and write the report")
    parser.add_argument("--ci", action="store_true", help="subset checked against a current report (see above)")
    parser.add_argument("--subset", action="store_true", help="compile the fixed subset only")
    parser.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1), help="compile processes")
    parser.add_argument("--json", help="also write the rows computed by this run to this file")
    parser.add_argument("--try", dest="candidates", action="append", default=[], metavar="LAUNCH:CONFIG",
                        help="compile a candidate config instead of the lists, e.g. "
                             "'conv_glu/_conv_glu_fwd_kernel:BLOCK_M=64,BLOCK_N=32,BLOCK_K=16,num_warps=4,num_stages=3' "
                             "(launch names as in the table, with the module; repeatable); exits 1 if one breaks the rule")
    return parser


def _run_candidates(specs: Sequence[str], dtypes: Sequence[str], targets: Sequence[str], n_jobs: int) -> int:
    rows = run_jobs(try_jobs(specs, dtypes, targets), n_jobs)
    print(format_table(rows))
    print(summarize(rows))
    return 1 if any(row_violations(r) for r in rows) else 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)

    missing = tools_missing()
    if missing:
        print(f"gpu_check cannot run: {missing}", file=sys.stderr)
        return 2
    # a fresh Triton cache: every compile is timed from scratch, ~/.triton is left alone
    cache = tempfile.TemporaryDirectory(prefix="gpu_check_cache_")
    os.environ["TRITON_CACHE_DIR"] = cache.name
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # Triton 3.9's default, without its warning

    def pick(text, allowed, what):
        items = [s.strip() for s in text.split(",") if s.strip()]
        bad = [s for s in items if s not in allowed]
        if bad:
            parser.error(f"unknown {what} {bad}; choose from {list(allowed)}")
        return items

    targets = pick(args.targets, TARGETS, "targets")
    dtypes = pick(args.dtypes, DTYPES, "dtypes")
    modules = pick(args.kernels, KERNEL_MODULES, "kernels")
    report_path = Path(args.report)
    t0 = time.perf_counter()
    if args.ci:
        status = ci(report_path, args.jobs, modules)
        print(f"gpu_check --ci: {time.perf_counter() - t0:.0f} s, {'ok' if status == 0 else 'FAILED'}")
        return status
    if args.write_report and (set(targets) != set(TARGETS) or set(dtypes) != set(DTYPES) or args.subset):
        parser.error("--write-report compiles the whole matrix: no --targets/--dtypes/--subset")
    if args.candidates:
        if args.write_report or args.subset:
            parser.error("--try checks candidates only: no --write-report/--subset")
        try:
            return _run_candidates(args.candidates, dtypes, targets, args.jobs)
        except ValueError as exc:
            parser.error(str(exc))
    jobs = subset_jobs(modules) if args.subset else build_jobs(modules, dtypes, targets)
    rows = run_jobs(jobs, args.jobs)
    seconds = time.perf_counter() - t0
    print(format_table(rows))
    print(summarize(rows) + f"; {seconds:.0f} s wall with {args.jobs} processes")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")
    if args.write_report:
        write_report(report_path, rows, modules, seconds, args.jobs)
        print(f"wrote {report_path}")
    bad = [] if args.subset else unusable(rows)
    for line in bad:
        print(line)
    return 1 if bad or any(r.get("error") for r in rows) else 0


def _reexec_without_interpreter() -> None:
    """The kernels must be compiled as JITFunctions: drop TRITON_INTERPRET and start again."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    os.execve(sys.executable, [sys.executable, "-m", "convs2s_kernels.gpu_check", *sys.argv[1:]], env)


if __name__ == "__main__":
    if os.environ.get("TRITON_INTERPRET") == "1":
        _reexec_without_interpreter()
    sys.exit(main())
