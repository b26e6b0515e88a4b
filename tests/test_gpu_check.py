"""The GPU config check (``python3 -m convs2s_kernels.gpu_check``): its rule, the parsing of the
CUDA tools' output, the committed report, the autotuners' run-time pruning, and the CI mode
itself (compiled for sm_80/sm_90 on this CPU, in a subprocess without the interpreter)."""

import functools
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import triton

from convs2s_kernels import gpu_check
from harness import REQUIRE_ENV, required_backends
from convs2s_kernels.triton_common import fits
from convs2s_kernels.triton_common.fits import (MAX_COMPILE_S, SHARED_LIMITS, config_fits, config_id, prune_configs,
                                                row_violations, violations)

REPO = Path(__file__).resolve().parent.parent
MISSING = gpu_check.tools_missing()


def needs_tools(test):
    """Run ``test`` where Triton can compile for a GPU; elsewhere skip it, or fail it when the triton
    backend is required (CI), so that a broken Triton install cannot pass the checks unseen."""
    @functools.wraps(test)
    def run(*args, **kwargs):
        if MISSING is not None:
            if "triton" in required_backends():
                pytest.fail(f"the triton backend is required ({REQUIRE_ENV}) but cannot compile for a GPU: {MISSING}")
            pytest.skip(f"cannot compile for a GPU here: {MISSING}")
        return test(*args, **kwargs)
    return run

# `cuobjdump --dump-resource-usage` of a Triton 3.9 cubin (conv_glu forward, fp32 IEEE, sm_80)
CUOBJDUMP_SAMPLE = """
Fatbin elf code:
================
arch = sm_80
code version = [1,8]
host = linux
compile_size = 64bit

Resource usage:
 Common:
  GLOBAL:0
 Function _conv_glu_fwd_kernel:
  REG:32 STACK:8416 SHARED:0 LOCAL:0 CONSTANT[0]:472 TEXTURE:0 SURFACE:0 SAMPLER:0
"""
# ptxas -v of the same kernel
PTXAS_SAMPLE = """ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function '_conv_glu_fwd_kernel' for 'sm_80'
ptxas info    : Function properties for _conv_glu_fwd_kernel
    8416 bytes stack frame, 60168 bytes spill stores, 70880 bytes spill loads
ptxas info    : Used 32 registers, used 1 barriers, 8416 bytes cumulative stack size, 472 bytes cmem[0]
ptxas info    : Compile time = 4217.380 ms
"""


def _env_without_interpreter():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def _run_check(*args, timeout=600):
    return subprocess.run([sys.executable, "-m", "convs2s_kernels.gpu_check", *args], cwd=REPO,
                          env=_env_without_interpreter(), capture_output=True, text=True, timeout=timeout)


# --- the rule -------------------------------------------------------------------------------------

def test_rule_shared_memory_limit_per_target():
    assert SHARED_LIMITS == {"sm_80": 166912, "sm_90": 232448}  # 163 KB (A100), 227 KB (H100)
    assert config_fits(166912, 0, 1.0, "sm_80")
    assert not config_fits(166913, 0, 1.0, "sm_80")
    assert config_fits(166913, 0, 1.0, "sm_90")
    assert config_fits(232448, 0, 1.0, "sm_90")
    assert not config_fits(240 * 1024, 0, 1.0, "sm_90")  # the TF32 conv+GLU config the H100 refused
    assert violations(240 * 1024, 0, 1.0, "sm_90") == ["shared memory 245760 B > 232448 B (sm_90)"]
    # the run-time pruning passes the device's own limit (an RTX 3090: 99 KB)
    assert not config_fits(120 * 1024, 0, 1.0, "sm_80", limit=101376)
    with pytest.raises(ValueError, match="unknown target"):
        config_fits(0, 0, 0.0, "sm_75")


def test_rule_spills_and_compile_time():
    assert not config_fits(1024, 8, 1.0, "sm_90")
    assert violations(1024, 8, 1.0, "sm_90") == ["spills 8 B"]
    assert config_fits(1024, 0, MAX_COMPILE_S, "sm_90")
    assert not config_fits(1024, 0, MAX_COMPILE_S + 0.1, "sm_90")
    assert config_fits(1024, 0, None, "sm_90")  # compile time unknown: not part of the verdict
    assert len(violations(300_000, 16, 59.5, "sm_80")) == 3
    assert row_violations({"error": "PTXASError: boom", "target": "sm_90"}) == ["compile failed: PTXASError: boom"]


def test_oversized_config_in_fake_metadata_is_flagged_and_pruned():
    rows = [dict(kernel="m/k", site="", config="A", dtype="bf16", target="sm_90", shared=240 * 1024,
                 spill_stores=0, spill_loads=0, compile_s=2.0),
            dict(kernel="m/k", site="", config="B", dtype="bf16", target="sm_90", shared=64 * 1024,
                 spill_stores=0, spill_loads=0, compile_s=2.0)]
    assert row_violations(rows[0]) and not row_violations(rows[1])
    assert "pruned: shared memory" in gpu_check.format_table(rows)
    assert gpu_check.unusable(rows) == []
    assert gpu_check.unusable(rows[:1]) == ["m/k bf16 sm_90: no config keeps the rule"]


# --- the tools' output ----------------------------------------------------------------------------

def test_parse_cuobjdump_resource_usage():
    usage = gpu_check.parse_resource_usage(CUOBJDUMP_SAMPLE)
    assert usage == {"_conv_glu_fwd_kernel": dict(registers=32, stack=8416, shared=0, local=0)}
    assert gpu_check.parse_resource_usage("no functions here") == {}


def test_parse_ptxas_log():
    log = gpu_check.parse_ptxas_log(PTXAS_SAMPLE)
    assert log == dict(stack_frame=8416, spill_stores=60168, spill_loads=70880, registers=32)
    assert gpu_check.parse_ptxas_log("") is None
    clean = PTXAS_SAMPLE.replace("8416 bytes stack frame, 60168 bytes spill stores, 70880 bytes spill loads",
                                 "0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads")
    assert gpu_check.parse_ptxas_log(clean)["spill_stores"] == 0


SASS_SAMPLE = """
        /*0a70*/                   WARPGROUP.ARRIVE ;
        /*0a80*/                   HGMMA.64x64x16.F32.BF16 R24, gdesc[UR4], R24, gsb0 ;
        /*0b10*/                   HMMA.16816.F32.BF16 R4, R8, R12, R4 ;
"""


def test_tensor_core_instructions_are_read_from_the_sass():
    assert gpu_check.tensor_core_ops(SASS_SAMPLE) == "HGMMA"  # the most capable family found
    assert gpu_check.tensor_core_ops(SASS_SAMPLE.replace("HGMMA", "FFMA")) == "HMMA"
    assert gpu_check.tensor_core_ops("        /*0010*/  FFMA R1, R2, R3, R1 ;\n") == "-"
    assert gpu_check.tensor_core_ops("  /*0010*/  IMMA.16832.S8.S8 R0, R4, R8, R0 ;") == "IMMA"


def test_try_spec_parsing():
    launch, cfg = gpu_check.parse_try("attention_embsum/_bmm_kernel[dq]:BLOCK_M=64,BLOCK_N=32,num_warps=8")
    assert launch == "attention_embsum/_bmm_kernel[dq]"
    assert cfg == dict(BLOCK_M=64, BLOCK_N=32, num_warps=8, num_stages=3)
    with pytest.raises(ValueError):
        gpu_check.parse_try("no-config")


# --- the run-time pruning ---------------------------------------------------------------------------

def _row(config, shared, spills=0, compile_s=1.0, dtype="bf16", target="sm_80", site=""):
    return dict(kernel="conv_glu/_conv_glu_fwd_kernel", site=site, config=config, dtype=dtype, target=target,
                shared=shared, spill_stores=spills, spill_loads=0, compile_s=compile_s)


def test_prune_configs_applies_the_rule_to_the_report_rows():
    big = triton.Config(dict(BLOCK_M=128, BLOCK_N=64, BLOCK_K=32), num_warps=8, num_stages=4)
    mid = triton.Config(dict(BLOCK_M=64, BLOCK_N=64, BLOCK_K=32), num_warps=4, num_stages=4)
    small = triton.Config(dict(BLOCK_M=32, BLOCK_N=32, BLOCK_K=32), num_warps=4, num_stages=3)
    new = triton.Config(dict(BLOCK_M=16, BLOCK_N=16, BLOCK_K=16), num_warps=4, num_stages=3)
    assert config_id(big) == "BLOCK_M=128 BLOCK_N=64 BLOCK_K=32 w8 s4"
    report = {"rows": [_row(config_id(big), 120 * 1024), _row(config_id(mid), 48 * 1024, spills=24),
                       _row(config_id(small), 24 * 1024),
                       _row(config_id(small), 24 * 1024, compile_s=25.0, site="other"),  # any site counts
                       _row(config_id(big), 240 * 1024, target="sm_90")]}
    kernel = "conv_glu/_conv_glu_fwd_kernel"
    # an A100: the big config fits, the spilling one and the slow one go; one without rows stays
    assert prune_configs([big, mid, small, new], kernel, "bf16", "sm_80", None, report) == [big, new]
    # an RTX 3090 (sm_86, 99 KB) reads the sm_80 rows with its own limit
    assert prune_configs([big, mid, new], kernel, "bf16", "sm_80", 101376, report) == [new]
    assert prune_configs([big, mid, small], kernel, "bf16", "sm_90", None, report) == [mid, small]
    # never empty: the least shared memory is kept when nothing fits
    assert prune_configs([big, mid], kernel, "bf16", "sm_80", 1024, report) == [mid]
    # no numbers for this device, dtype or kernel: nothing pruned
    assert prune_configs([big, mid], kernel, "bf16", None, None, report) == [big, mid]
    assert prune_configs([big, mid], kernel, "fp16", "sm_80", None, report) == [big, mid]
    assert prune_configs([big, mid], kernel, "bf16", "sm_80", None, None) == [big, mid]


def test_prune_by_report_reads_the_device(monkeypatch):
    big = triton.Config(dict(BLOCK_M=128, BLOCK_N=64, BLOCK_K=32), num_warps=8, num_stages=4)
    small = triton.Config(dict(BLOCK_M=32, BLOCK_N=32, BLOCK_K=32), num_warps=4, num_stages=3)
    report = {"rows": [_row(config_id(big), 120 * 1024, dtype="fp32-tf32"),
                       _row(config_id(small), 24 * 1024, dtype="fp32-tf32")]}
    monkeypatch.setattr(fits, "runtime_report", lambda: report)
    prune = fits.prune_by_report("conv_glu/_conv_glu_fwd_kernel")["early_config_prune"]
    x = SimpleNamespace(dtype=torch.float32, device="cuda:0")
    monkeypatch.setattr(fits, "device_shared_limit", lambda device=None: ((8, 0), 166912))
    assert prune([big, small], {"x_ptr": x, "M": 4}, PRECISION="tf32") == [big, small]
    monkeypatch.setattr(fits, "device_shared_limit", lambda device=None: ((8, 6), 101376))
    assert prune([big, small], {"x_ptr": x, "M": 4}, PRECISION="tf32") == [small]
    assert prune([big, small], {"x_ptr": x, "M": 4}, PRECISION="ieee") == [big, small]  # no fp32-ieee rows
    monkeypatch.setattr(fits, "device_shared_limit", lambda device=None: ((10, 0), 232448))
    assert prune([big, small], {"x_ptr": x}, PRECISION="tf32") == [big, small]  # no numbers for sm_100
    # the GPU tests compile one config per kernel: the last kept (smallest tile)
    monkeypatch.setenv(fits.AUTOTUNE_ENV, "0")
    assert prune([big, small], {"x_ptr": x}, PRECISION="tf32") == [small]
    monkeypatch.setattr(fits, "device_shared_limit", lambda device=None: ((8, 6), 101376))
    assert prune([small, big], {"x_ptr": x, "M": 4}, PRECISION="tf32") == [small]  # big pruned first


def test_runtime_report_needs_the_same_triton(monkeypatch):
    fits.runtime_report.cache_clear()
    monkeypatch.setattr(fits, "load_report", lambda: {"triton": "0.0.1", "rows": []})
    with pytest.warns(UserWarning, match="made with triton 0.0.1"):
        assert fits.runtime_report() is None
    fits.runtime_report.cache_clear()
    monkeypatch.setattr(fits, "load_report", lambda: {"triton": triton.__version__, "rows": []})
    assert fits.runtime_report() == {"triton": triton.__version__, "rows": []}
    fits.runtime_report.cache_clear()


def _autotuners():
    import importlib

    from triton.runtime.autotuner import Autotuner

    from convs2s_kernels.ops import TRITON_OPS

    for module in TRITON_OPS:
        mod = importlib.import_module(f"convs2s_kernels.ops.{module}.triton_kernels")
        for name, obj in vars(mod).items():
            if isinstance(obj, Autotuner):
                yield f"{module}/{name}", obj


def _launched_kernels():
    """Every kernel the ops launch: their autotuners, and the plain ``*_kernel`` JIT functions
    launched with fixed warps (the search's)."""
    import importlib

    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    from convs2s_kernels.ops import TRITON_OPS

    yield from (name for name, _ in _autotuners())
    for module in TRITON_OPS:
        mod = importlib.import_module(f"convs2s_kernels.ops.{module}.triton_kernels")
        for name, obj in vars(mod).items():
            if (isinstance(obj, (JITFunction, InterpretedFunction)) and name.endswith("_kernel")
                    and obj.fn.__module__ == mod.__name__):
                yield f"{module}/{name}"


def test_every_autotuner_prunes_by_the_report():
    tuners = dict(_autotuners())
    assert len(tuners) == 11
    for name, tuner in tuners.items():
        prune = tuner.early_config_prune
        assert prune is not None, name
        assert prune.__qualname__.startswith("prune_by_report"), name
        assert prune.__closure__ and name in [c.cell_contents for c in prune.__closure__], name


AUTOTUNER_SNIPPET = """
import torch
from convs2s_kernels.triton_common import fits
from convs2s_kernels.triton_common.fits import config_id
from convs2s_kernels.ops.conv_glu import triton_kernels as m
tuner = m._conv_glu_fwd_kernel
fits.device_shared_limit = lambda device=None: ((8, 0), 166912)  # an A100
tuner.nargs = dict(zip(tuner.arg_names, [torch.empty(2, 3, 4)]))
print(len(tuner.configs), [config_id(c) for c in tuner.prune_configs(dict(K_W=3, PRECISION="ieee"))])
"""


def test_gpu_autotuner_prunes_through_triton():
    # Triton's own Autotuner.prune_configs, as on a GPU (not the interpreter's single config)
    out = subprocess.run([sys.executable, "-c", AUTOTUNER_SNIPPET], cwd=REPO, env=_env_without_interpreter(),
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip() == "5 ['BLOCK_M=64 BLOCK_N=32 BLOCK_K=16 w4 s3', 'BLOCK_M=32 BLOCK_N=32 BLOCK_K=32 w4 s3']"


def test_config_names_agree_between_checker_and_pruner():
    cfg = triton.Config(dict(BLOCK_T=64, BLOCK_S=32, BLOCK_E=64, BLOCK_D=32), num_warps=4, num_stages=3)
    assert gpu_check.config_name(cfg.all_kwargs()) == config_id(cfg) == "BLOCK_T=64 BLOCK_S=32 BLOCK_E=64 BLOCK_D=32 w4 s3"


# --- the committed report ---------------------------------------------------------------------------

def test_committed_report_is_current_and_leaves_every_kernel_a_config():
    report = json.loads(fits.REPORT_PATH.read_text())
    assert report["triton"] == triton.__version__, gpu_check.STALE_MESSAGE
    assert report["sources"] == fits.source_hashes(), gpu_check.STALE_MESSAGE
    assert report["limits"] == SHARED_LIMITS and report["max_compile_s"] == MAX_COMPILE_S
    rows = report["rows"]
    assert gpu_check.unusable(rows) == []
    assert not [r for r in rows if r.get("error")]
    kernels = {r["kernel"] for r in rows}
    assert kernels == set(_launched_kernels())
    assert {(r["dtype"], r["target"]) for r in rows} == {(d, t) for d in gpu_check.DTYPES for t in gpu_check.TARGETS}
    for r in rows:  # every kept row keeps the rule: shared memory within the target, no spills, <= 20 s
        if not row_violations(r):
            assert r["shared"] <= SHARED_LIMITS[r["target"]] and r["spill_stores"] + r["spill_loads"] == 0
            assert r["compile_s"] <= MAX_COMPILE_S


# Decoding kernels whose products have a handful of rows (a sentence's beams): too few for a
# 64-row warp group, so mma.sync is what they should use on Hopper too.
FEW_ROW_KERNELS = {"attention_step/_attention_step_kernel"}


def test_committed_report_says_which_products_use_tensor_cores():
    """Read from each compile's SASS: IEEE fp32 never runs on tensor cores (TF32 would round its
    inputs); every kernel with tensor-core products has a kept bf16 config using Hopper's
    warp-group MMA on sm_90 (what the training kernels need to beat cuDNN there) and mma.sync on
    sm_80, where warp-group MMA does not exist."""
    rows = json.loads(fits.REPORT_PATH.read_text())["rows"]
    assert all(r["mma"] in ("HGMMA", "HMMA", "-") for r in rows)
    assert not [r for r in rows if r["dtype"] == "fp32-ieee" and r["mma"] != "-"]
    assert not [r for r in rows if r["target"] == "sm_80" and r["mma"] == "HGMMA"]
    kept = [r for r in rows if not row_violations(r) and r["dtype"] == "bf16"]
    on_tensor_cores = {r["kernel"] for r in kept if r["mma"] != "-"}
    assert {"conv_glu/_conv_glu_fwd_kernel", "conv_glu/_conv_glu_bwd_dx_kernel", "conv_glu/_conv_glu_bwd_dw_kernel",
            "attention_embsum/_attention_fwd_kernel"} <= on_tensor_cores
    for kernel in sorted(on_tensor_cores - FEW_ROW_KERNELS):
        assert any(r["kernel"] == kernel and r["target"] == "sm_90" and r["mma"] == "HGMMA" for r in kept), kernel


def test_committed_report_prunes_fp32_ieee_to_the_small_tiles_on_an_a100():
    report = json.loads(fits.REPORT_PATH.read_text())
    kernel = "conv_step/_conv_step_fwd_kernel"
    names = sorted({r["config"] for r in report["rows"] if r["kernel"] == kernel})
    assert len(names) == 5
    same = lambda c: c  # noqa: E731  (the report's names stand for the configs)
    assert prune_configs(names, kernel, "fp32-ieee", "sm_80", None, report, key=same) == \
        ["BLOCK_M=16 BLOCK_N=64 BLOCK_K=32 w4 s3"]
    assert prune_configs(names, kernel, "bf16", "sm_90", None, report, key=same) == names
    # an sm_86 card (99 KB) also loses the 108 KB fp32 TF32 tile the A100 keeps
    tf32_a100 = prune_configs(names, kernel, "fp32-tf32", "sm_80", None, report, key=same)
    tf32_sm86 = prune_configs(names, kernel, "fp32-tf32", "sm_80", 101376, report, key=same)
    assert "BLOCK_M=16 BLOCK_N=64 BLOCK_K=64 w4 s4" in set(tf32_a100) - set(tf32_sm86)


# --- compiling for the GPU on this CPU (subprocesses without TRITON_INTERPRET) -----------------------

@needs_tools
def test_ci_mode_passes():
    out = _run_check("--ci")
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-4000:]
    assert "gpu_check --ci:" in out.stdout and "ok" in out.stdout
    assert "_conv_step_fwd_kernel" in out.stdout and "sm_90" in out.stdout


@needs_tools
def test_oversized_candidate_is_flagged():
    # 128x256 tile, K = 128, 4 stages: 4 x (128x128 + 128x256) x 2 B = 384 KB of shared memory
    out = _run_check("--try", "attention_embsum/_bmm_kernel[dq]:BLOCK_M=128,BLOCK_N=256,BLOCK_K=128,num_warps=8,"
                     "num_stages=4", "--dtypes", "bf16", "--targets", "sm_90")
    assert out.returncode == 1, out.stdout[-4000:] + out.stderr[-4000:]
    assert "pruned: shared memory" in out.stdout and "> 232448 B (sm_90)" in out.stdout


@needs_tools
@pytest.mark.slow
def test_ci_mode_fails_on_a_stale_report(tmp_path):
    report = json.loads(fits.REPORT_PATH.read_text())
    report["sources"]["conv_step"] = "0" * 64
    path = tmp_path / "report.json"
    path.write_text(json.dumps(report))
    # the stale module's matrix narrowed to one dtype and target: the failure is what is checked
    out = _run_check("--ci", "--kernels", "conv_step", "--report", str(path), "--dtypes", "bf16", "--targets", "sm_90")
    assert out.returncode == 1
    assert gpu_check.STALE_MESSAGE in out.stdout
    assert "sources changed since the report: conv_step" in out.stderr


def test_autotune_keys_are_bucketed_so_a_new_length_does_not_tune_again():
    """No autotuner keys on a raw size that changes with the sentence (S, M, N, K, T): the
    attention kernels key on ``S_BUCKET``, the conv kernels on channel counts and width."""
    import ast
    from pathlib import Path

    from convs2s_kernels.triton_common.config import bucket

    assert [bucket(n) for n in (1, 16, 17, 25, 200, 256, 257)] == [16, 16, 32, 32, 256, 256, 512]
    ops = Path(__file__).resolve().parent.parent / "convs2s_kernels" / "ops"
    keys = []
    for path in sorted(ops.glob("*/triton_kernels.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and ast.unparse(node.func) == "triton.autotune":
                key = next(k.value for k in node.keywords if k.arg == "key")
                keys.append((path.parent.name, ast.literal_eval(key)))
    assert len(keys) == 11, keys
    varying = {"S", "T", "M", "N", "K", "B"}
    assert not [k for k in keys if varying & set(k[1])], keys
