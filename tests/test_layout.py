"""The layering the code relies on, checked so that it stays true:

* nothing outside ``convs2s_kernels`` touches one of its names starting with ``_``;
* the model package imports nothing from the benchmarks (``convs2s_bench``) at import time;
* every op has one name in every tree: its folder (public function, reference, backends' glue),
  its C++ kernel, its tests and its benchmark; every other file of those trees is named as shared;
* comments say why; the measurements behind them live under ``bench/results/``;
* the model modules are the paper's model: no engine machinery imported or named, fairseq's size;
* no function in the packages is 60 lines or longer.
"""

import ast
import importlib
import re
from pathlib import Path

import pytest

import convs2s_kernels as ck
from convs2s_kernels.ops import TRITON_OPS

REPO = Path(__file__).resolve().parent.parent
OUTSIDE_KERNELS = ["convs2s", "bench", "tests", "examples", "scripts"]
PACKAGES = ["convs2s", "convs2s_kernels", "bench/convs2s_bench"]
OPS = ["conv_glu", "attention_embsum", "attention_step", "conv_step", "linear", "linear_int8", "linear_w8a8",
       "decoder_step", "beam_candidates", "beam_update", "output_loss", "dropout", "nag_step", "grad_norm"]
# ops without a C++ kernel: on the CPU their reference runs, or a fused op holds their work
# (attention_step: the one-call decoder_step folds the attention in C++)
NO_CPP = {"attention_step"}
MAX_FUNCTION_LINES = 60
# files of the op trees that belong to no single op, each with its job
SHARED = {
    "csrc": {"convs2s_cpu.cpp": "the pybind module", "small_gemm.cpp": "the few-row kernels every float and int8-weight product runs on",
             "library_gemm.cpp": "the GEMM libraries' products", "kernel_choice.cpp": "the measured kernel choice",
             "glu_cpu.cpp": "the conv kernels' GLU epilogue", "lincomb_cpu.cpp": "the Winograd transforms' row combinations", "isa.cpp": "the instruction set chosen at run time",
             "huge_pages.cpp": "weights on huge pages", "fma_peak.cpp": "the compute roofline's probe",
             "read_peak.cpp": "the bandwidth roofline's probe"},
    "bench": {"test_bench_generate.py": "whole-model generation",
              "test_bench_host_overhead.py": "host cost per call of every op"},
    "tests/ops": {"test_fuzz.py": "random shapes through every op", "test_few_rows_kernels.py": "the shared few-row kernels",
                  "harness.py": "the ops' test harness"},
}
ISA_SUFFIXES = ("_cpu", "_avx2", "_avx512")  # csrc/<op>_cpu.cpp, split by instruction set where it helps


def python_files(folders):
    for folder in folders:
        yield from sorted((REPO / folder).rglob("*.py"))


def private_kernel_names(tree: ast.AST):
    """``(line, text)`` of every reach into a private name of convs2s_kernels in a module."""
    aliases = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            aliases |= {a.asname or a.name for a in node.names if a.name.split(".")[0] == "convs2s_kernels"}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "convs2s_kernels":
            aliases |= {a.asname or a.name for a in node.names}  # modules of it, e.g. `dispatch`
            parts = node.module.split(".") + [a.name for a in node.names]
            if any(p.startswith("_") and not p.startswith("__") for p in parts):
                yield node.lineno, f"from {node.module} import {', '.join(a.name for a in node.names)}"
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
            root = node.value
            while isinstance(root, ast.Attribute):
                root = root.value
            if isinstance(root, ast.Name) and root.id in aliases | {"ck"}:
                yield node.lineno, ast.unparse(node)


def test_nothing_outside_the_kernel_library_touches_its_private_names():
    found = [f"{path.relative_to(REPO)}:{line}: {text}"
             for path in python_files(OUTSIDE_KERNELS) for line, text in private_kernel_names(ast.parse(path.read_text()))]
    assert not found, "private names of convs2s_kernels used outside it:\n" + "\n".join(found)


def test_the_private_name_check_can_fail():
    tree = ast.parse("import convs2s_kernels as ck\nck._cpp._C.f()\nfrom convs2s_kernels._checks import x\n"
                     "from convs2s_kernels import dispatch\ndispatch._REGISTRY.clear()\n")
    assert sorted(line for line, _ in private_kernel_names(tree)) == [2, 2, 3, 5]


def test_the_model_package_does_not_import_the_benchmarks():
    for path in python_files(["convs2s"]):
        for node in ast.parse(path.read_text()).body:  # module level: what `import convs2s` runs
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            assert not any(n.startswith("convs2s_bench") for n in names), f"{path.name} imports {names}"


MODEL_MODULES = ["layers", "encoder", "decoder", "model", "architectures"]
# what belongs to the decoding engine (convs2s.engine), never to the model's modules
ENGINE_IMPORTS = ("convs2s.engine", "convs2s_kernels.tune", "convs2s_kernels.huge_pages", "convs2s_kernels.dispatch")
ENGINE_NAMES = ("int8", "w8a8", "packed", "pack_", "huge_page", "tune", "make_static", "static_step", "fused", "quantize",
                "fold_attention")
FCONV_LINES = 756 + 125  # fairseq's fconv.py and LinearizedConvolution


def model_module_findings(source: str) -> list:
    """Imports of the engine's machinery and identifiers naming it (int8, packing, kernel choice,
    step modes) in a model module's source."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            modules = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            found += [f"line {node.lineno}: imports {m}" for m in modules if m.startswith(ENGINE_IMPORTS)]
            if isinstance(node, ast.ImportFrom) and node.level and (node.module or "").startswith("engine"):
                found.append(f"line {node.lineno}: imports .{node.module}")
        name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else \
            node.name if isinstance(node, (ast.FunctionDef, ast.ClassDef)) else \
            node.arg if isinstance(node, ast.arg) else None
        if name and any(word in name.lower() for word in ENGINE_NAMES):
            found.append(f"line {node.lineno}: {name}")
    return found


def test_the_model_modules_are_the_paper_alone():
    found = {m: model_module_findings((REPO / "convs2s" / f"{m}.py").read_text()) for m in MODEL_MODULES}
    assert not any(found.values()), f"engine machinery in the model: {found}"
    lines = sum(len((REPO / "convs2s" / f"{m}.py").read_text().splitlines()) for m in MODEL_MODULES)
    assert lines <= FCONV_LINES, f"the model modules hold {lines} lines, fairseq's fconv {FCONV_LINES}"


def test_the_model_module_check_can_fail():
    source = ("from convs2s_kernels.tune import ensure\nfrom .engine import prepare\n"
              "def f(m):\n    m.use_int8 = True\n    return m.step_packed()\n")
    assert len(model_module_findings(source)) == 4


@pytest.mark.parametrize("op", OPS)
def test_each_op_has_one_name_in_every_tree(op):
    folder = REPO / "convs2s_kernels" / "ops" / op
    have = {p.name for p in folder.glob("*.py")}
    want = {"__init__.py", "api.py", "reference.py"} | (set() if op in NO_CPP else {"cpp.py"}) | \
        ({"triton.py", "triton_kernels.py", "triton_launches.py"} if op in TRITON_OPS else set())
    assert want <= have, f"{folder} lacks {sorted(want - have)}"
    assert not (op in NO_CPP and (folder / "cpp.py").exists()), f"{op} has a cpp backend: take it out of NO_CPP"
    paths = [f"tests/ops/test_{op}.py", f"bench/test_bench_{op}.py"] + ([] if op in NO_CPP else [f"csrc/{op}_cpu.cpp"])
    for path in paths:
        assert (REPO / path).exists(), f"{op} has no {path}"
        assert path in importlib.import_module(f"convs2s_kernels.ops.{op}").__doc__, f"{op}'s folder does not cite {path}"
    assert callable(getattr(ck, op)) and callable(getattr(ck, f"{op}_ref"))


def op_of(stem: str):
    """The op a file stem names (``linear_w8a8_avx2`` -> ``linear_w8a8``), longest name first."""
    return next((op for op in sorted(OPS, key=len, reverse=True) if stem == op or stem.startswith(op + "_")), None)


# the part of a file's name that names its op, per tree, and the files each tree holds
STEMS = {"csrc": lambda n: n[:-len(".cpp")], "bench": lambda n: n[len("test_bench_"):-len(".py")],
         "tests/ops": lambda n: n[len("test_"):-len(".py")]}
GLOBS = {"csrc": "*.cpp", "bench": "test_bench_*.py", "tests/ops": "*.py"}


def unnamed_files(tree: str, names) -> list:
    """Files of an op tree that name no op (a C++ file also its instruction set) and are not shared."""
    def named(name):
        stem = STEMS[tree](name)
        op = op_of(stem)
        return op is not None and (tree != "csrc" or stem[len(op):] in ISA_SUFFIXES)
    return sorted(n for n in names if n not in SHARED[tree] and n != "__init__.py" and not named(n))


def test_every_file_of_the_op_trees_names_its_op_or_is_shared():
    found = [f"{tree}/{name}" for tree, pattern in GLOBS.items()
             for name in unnamed_files(tree, [p.name for p in (REPO / tree).glob(pattern)])]
    assert not found, "files that name no op (rename them, or list them in SHARED with their job):\n" + "\n".join(found)
    stale = [f"{tree}/{n}" for tree, names in SHARED.items() for n in names if not (REPO / tree / n).exists()]
    assert not stale, f"SHARED lists files that are gone: {stale}"


def test_the_op_name_check_can_fail():
    assert op_of("linear_w8a8_avx2") == "linear_w8a8" and op_of("linear_int8_cpu") == "linear_int8"
    assert op_of("attention_cpu") is None and op_of("small_gemm") is None
    assert unnamed_files("csrc", ["attention_cpu.cpp", "conv_glu_cpu.cpp", "isa.cpp", "linear_w8a8_avx2.cpp",
                                  "linear_w8a8_probe.cpp"]) == ["attention_cpu.cpp", "linear_w8a8_probe.cpp"]
    assert unnamed_files("bench", ["test_bench_linear_int8.py", "test_bench_int8.py"]) == ["test_bench_int8.py"]


# measurement history in a comment or docstring: a machine, a dated or side-by-side measurement, a
# measured ratio. It belongs under bench/results/ (kernel-decisions.md for the kernels' choices).
MEASUREMENT_LOG = re.compile(r"Zen ?[0-9]|Xeon|EPYC|\bVM\b|vCPU|[0-9]\.[0-9]+x (the|at)\b|alternated|paired in|"
                             r"20[0-9]{2}-[0-9]{2}-[0-9]{2}|[0-9.]+-[0-9.]+x\b|[0-9]% of (an?|the)\b|"
                             r"[0-9]+-[0-9]+% (faster|slower)")
SOURCE_GLOBS = [("csrc", "*.cpp"), ("csrc", "*.h"), ("convs2s", "**/*.py"), ("convs2s_kernels", "**/*.py")]


def measurement_logs(text: str) -> list:
    return [f"line {i}: {line.strip()}" for i, line in enumerate(text.splitlines(), 1) if MEASUREMENT_LOG.search(line)]


def test_the_sources_carry_no_measurement_history():
    found = [f"{path.relative_to(REPO)} {hit}" for folder, pattern in SOURCE_GLOBS
             for path in sorted((REPO / folder).glob(pattern)) for hit in measurement_logs(path.read_text())]
    assert not found, "move these to bench/results/ and cite the file:\n" + "\n".join(found)


def test_the_measurement_history_check_can_fail():
    assert len(measurement_logs("// on a Zen 5 VM, 0.86x the time at 5 rows\nint x;  // rows\n# 2026-11-25: alike\n"
                                "// ~6% of a step at 12 rows\n// 1.3-3x the library\n// 3 of 5 rows, 10-20% slower\n"
                                "MARGIN = 0.03  # at least 3% faster")) == 5


def test_no_function_is_60_lines_or_longer():
    long = []
    for path in python_files(PACKAGES):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines >= MAX_FUNCTION_LINES:
                    long.append(f"{path.relative_to(REPO)}:{node.lineno} {node.name} ({lines} lines)")
    assert not long, "split these by job:\n" + "\n".join(long)


# PyTorch's umbrella headers: torch/extension.h alone took 36 s a file at -O3 on a Zen 3 (the
# whole C++ frontend and pybind11), ATen/ATen.h 10 s (every operator); ATen/core/Tensor.h 2.6 s.
UMBRELLA_HEADERS = re.compile(r'#include\s*<(torch/extension\.h|torch/all\.h|torch/torch\.h|ATen/ATen\.h|'
                              r'ATen/Functions\.h|ATen/TensorOperators\.h)>')
BINDING = "convs2s_cpu.cpp"


def umbrella_includes(files):
    return sorted(f.name for f in files if UMBRELLA_HEADERS.search(f.read_text()))


def test_only_the_binding_file_parses_torchs_umbrella_headers():
    """Issue 58: the kernels' files include ATen's Tensor class and the operators they call, and
    the pybind11 module alone includes torch/extension.h: each file parses torch once, not 20 times."""
    assert umbrella_includes((REPO / "csrc").glob("*.[ch]*")) == [BINDING]


def test_the_umbrella_header_check_can_fail(tmp_path):
    (tmp_path / "k.cpp").write_text("#include <ATen/ATen.h>\n")
    (tmp_path / "h.h").write_text("#include <ATen/core/Tensor.h>\n")
    assert umbrella_includes(tmp_path.glob("*")) == ["k.cpp"]
