"""Every Triton config checked for the GPU, ahead of time, on a CPU.

``python3 -m convs2s_kernels.gpu_check`` compiles each launch of the package's Triton kernels
(those of :data:`~convs2s_kernels.ops.TRITON_OPS`, forward and backward where they have one) for
every autotune config, every dtype the kernels take (bf16, fp16, fp32 with IEEE and with TF32 products) and the
targets sm_80 (A100) and sm_90 (H100) with ``triton.compile`` and a ``GPUTarget``: no GPU or
driver needed. For each it reads the shared memory (``metadata.shared``), the registers and stack
(``cuobjdump --dump-resource-usage`` on the cubin, the wheel ships it), the spill stores and loads
(ptxas ``-v``), the tensor-core instructions in its SASS (``cuobjdump -sass``: ``HGMMA``, Hopper's
warp-group MMA, ``HMMA``, the warp-level mma.sync, or none) and the compile time (CPU seconds,
ptxas included), prints a table and applies the
rule of :mod:`convs2s_kernels.triton_common.fits` (shared memory within the target, no spills,
compile <= 20 s): it exits 1 when a config breaks it.

The signature of each launch is the one the kernel's own wrapper passes at the paper's shapes:
each op's recipe, ``ops/<op>/triton_launches.py``, runs the wrappers on ``meta`` tensors (contiguous,
16-byte aligned, as the model's are) with the launch intercepted, and the JIT's own specialization
turns the arguments into the signature, constexprs and alignment attributes a GPU run compiles.
An op's kernels are checked once its folder has a recipe and ``triton_common/fits.py`` lists the
sources its report rows depend on (``KERNEL_MODULES``).

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

The modules: :mod:`.launches` records the launches from the recipes, :mod:`.jobs` turns them into
(launch, config, dtype, target) jobs, :mod:`.compile` compiles a job and reads the CUDA tools'
output, :mod:`.report` prints the table, writes the report and tells when it is stale, :mod:`.cli`
is the command.
"""

from .cli import ci, main
from .compile import (HARD_TIMEOUT_S, bind, compile_job, nvidia_tool, parse_ptxas_log, parse_resource_usage,
                      resources, run_jobs, tensor_core_ops, tools_missing)
from .jobs import DTYPES, SUBSET_DTYPE, SUBSET_TARGET, TARGETS, Job, build_jobs, parse_try, subset_jobs, try_jobs
from .launches import Launch, collect_launches, config_name, recipe
from .report import (STALE_MESSAGE, dump_report, format_table, row_key, stale_modules, summarize, unusable,
                     write_report)

__all__ = [
    "ci", "main", "HARD_TIMEOUT_S", "bind", "compile_job", "nvidia_tool", "parse_ptxas_log", "parse_resource_usage",
    "resources", "run_jobs", "tensor_core_ops", "tools_missing", "DTYPES", "SUBSET_DTYPE", "SUBSET_TARGET", "TARGETS", "Job",
    "build_jobs", "parse_try", "subset_jobs", "try_jobs", "Launch", "collect_launches", "config_name", "recipe",
    "STALE_MESSAGE", "dump_report", "format_table", "row_key", "stale_modules", "summarize", "unusable",
    "write_report",
]
