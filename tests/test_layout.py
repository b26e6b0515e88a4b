"""The layering the code relies on, checked so that it stays true:

* nothing outside ``convs2s_kernels`` touches one of its names starting with ``_``;
* the model package imports nothing from the benchmarks (``convs2s_bench``) at import time;
* every op has its folder with the public function, its reference and its backends' glue;
* the model modules are the paper's model: no engine machinery imported or named, fairseq's size;
* no function in the packages is 60 lines or longer.
"""

import ast
from pathlib import Path

import pytest

import convs2s_kernels as ck
from convs2s_kernels.ops import TRITON_OPS

REPO = Path(__file__).resolve().parent.parent
OUTSIDE_KERNELS = ["convs2s", "bench", "tests", "examples", "scripts"]
PACKAGES = ["convs2s", "convs2s_kernels", "bench/convs2s_bench"]
OPS = ["conv_glu", "attention_embsum", "conv_step", "linear", "linear_int8", "linear_w8a8", "decoder_step", "beam_candidates", "beam_update"]
MAX_FUNCTION_LINES = 60
# ops benchmarked inside another op's suite, beside what they replace (not yet a suite of their own):
# int8 products against the float32 product, the one-call decoder step inside whole generations
BENCHMARK_SUITE = {"linear_int8": "linear", "linear_w8a8": "linear", "decoder_step": "generate"}


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
def test_each_op_has_one_folder_with_everything(op):
    folder = REPO / "convs2s_kernels" / "ops" / op
    have = {p.name for p in folder.glob("*.py")}
    want = {"__init__.py", "api.py", "reference.py", "cpp.py"} | ({"triton.py", "triton_kernels.py"} if op in TRITON_OPS else set())
    assert want <= have, f"{folder} lacks {sorted(want - have)}"
    assert (REPO / "tests" / "ops" / f"test_{op}.py").exists()
    bench = REPO / "bench" / f"test_bench_{BENCHMARK_SUITE.get(op, op)}.py"
    assert bench.exists(), f"{op}'s benchmark {bench.name} is missing"
    assert callable(getattr(ck, op)) and callable(getattr(ck, f"{op}_ref"))


def test_no_function_is_60_lines_or_longer():
    long = []
    for path in python_files(PACKAGES):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines >= MAX_FUNCTION_LINES:
                    long.append(f"{path.relative_to(REPO)}:{node.lineno} {node.name} ({lines} lines)")
    assert not long, "split these by job:\n" + "\n".join(long)
