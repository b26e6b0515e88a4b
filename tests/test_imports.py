"""No import cycles between the modules of ``convs2s`` and ``convs2s_kernels``, function-local
imports included: a cycle hidden in a function still ties two modules' jobs together (and breaks
the day the import moves to the top). Read from the source with ``ast``:

* module-level and function-local ``import`` / ``from ... import``, relative ones resolved;
* ``from pkg import name`` is an edge to ``pkg.name`` where that is a module, else to ``pkg``;
* imports under ``if TYPE_CHECKING:`` are left out (annotations only, never run);
* an edge to an ancestor package of the importing module is left out (``from .. import x``: a
  submodule reading its own package's ``__init__``, which Python imports before the submodule).
"""

import ast
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Sequence, Set

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("convs2s", "convs2s_kernels")


def module_files(root: Path, packages: Sequence[str]) -> Dict[str, Path]:
    """``{dotted module name: file}`` for every ``.py`` file under each package folder of ``root``."""
    out = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _import_nodes(node: ast.AST) -> Iterator[ast.AST]:
    """Every import statement in ``node``, at any depth, less the bodies of ``if TYPE_CHECKING:``."""
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        yield node
        return
    if isinstance(node, ast.If) and _is_type_checking(node.test):
        children = node.orelse  # the body runs only under a type checker
    else:
        children = list(ast.iter_child_nodes(node))
    for child in children:
        yield from _import_nodes(child)


def _known(name: str, modules: Set[str]) -> Optional[str]:
    """``name`` or its longest prefix that is a module of ours; None for a module outside them."""
    parts = name.split(".")
    while parts:
        if ".".join(parts) in modules:
            return ".".join(parts)
        parts.pop()
    return None


def _targets(node: ast.AST, module: str, is_package: bool, modules: Set[str]) -> Iterator[str]:
    if isinstance(node, ast.Import):
        yield from (a.name for a in node.names)
        return
    base = node.module or ""
    if node.level:  # relative: from the importing module's package, up level - 1
        package = module.split(".") if is_package else module.split(".")[:-1]
        package = package[:len(package) - (node.level - 1)]
        base = ".".join(package + ([base] if base else []))
    for alias in node.names:
        name = f"{base}.{alias.name}" if base else alias.name
        yield name if name in modules else base


def import_graph(root: Path, packages: Sequence[str] = PACKAGES) -> Dict[str, Set[str]]:
    """``{module: the modules of ours it imports}``, as the module docstring says."""
    files = module_files(root, packages)
    modules = set(files)
    graph: Dict[str, Set[str]] = {}
    for module, path in files.items():
        edges = graph.setdefault(module, set())
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in _import_nodes(tree):
            for name in _targets(node, module, path.name == "__init__.py", modules):
                target = _known(name, modules)
                if target is None or target == module or module.startswith(target + "."):
                    continue  # outside, itself, or an ancestor package
                edges.add(target)
    return graph


def find_cycles(graph: Dict[str, Set[str]]) -> List[List[str]]:
    """One cycle (``[a, b, ..., a]``) per strongly connected group of modules (Tarjan's algorithm)."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on_stack: Set[str] = set()
    groups: List[List[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return [_one_cycle(graph, set(group), group[0]) for group in groups]


def _one_cycle(graph: Dict[str, Set[str]], group: Set[str], start: str) -> List[str]:
    """The shortest path from ``start`` back to itself within ``group`` (breadth first)."""
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(graph[v] & group):
                if w == start:
                    return paths[v] + [start]
                if w not in paths:
                    paths[w] = paths[v] + [w]
                    nxt.append(w)
        frontier = nxt
    raise AssertionError(f"{start} is in no cycle of {sorted(group)}")


def test_the_packages_have_no_import_cycles():
    graph = import_graph(REPO)
    assert "convs2s.engine.prepared" in graph and "convs2s_kernels.tune_cache" in graph  # it read the packages
    cycles = find_cycles(graph)
    assert not cycles, "import cycles (function-local imports included):\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_the_cycle_check_can_fail(tmp_path):
    """Two modules importing each other, one of them inside a function, make a cycle; the same
    edge under ``if TYPE_CHECKING:`` does not, nor does an import of the parent package."""
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("from .a import f\n")
    (pkg / "a.py").write_text("from . import b\n\ndef f():\n    return b.g()\n")
    (pkg / "b.py").write_text("import pkg\n\ndef g():\n    from .a import f\n    return f\n")
    graph = import_graph(tmp_path, ["pkg"])
    assert graph == {"pkg": {"pkg.a"}, "pkg.a": {"pkg.b"}, "pkg.b": {"pkg.a"}}
    assert find_cycles(graph) == [["pkg.a", "pkg.b", "pkg.a"]]
    (pkg / "b.py").write_text("import pkg\nfrom typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .a import f\n")
    assert find_cycles(import_graph(tmp_path, ["pkg"])) == []
