"""Imports inside robo_resume/ point one way: the module import graph has no cycle.

Every ``robo_resume/**/*.py`` is parsed with ``ast`` and every import of a robo_resume module
counts, wherever it stands: at the top, under ``if TYPE_CHECKING:``, or inside a function. A
circle held by a TYPE_CHECKING import or a function-local import is still a circle (the two
modules know each other); break it with a Protocol in the lower module instead (as
``robo_resume/stream/loader.py``'s ``BatchSource`` does). A package ``__init__`` is a node of
its own whose edges are the modules it imports (its re-exports); importing from a package is an
edge to its ``__init__``.
"""

from __future__ import annotations

import ast
from collections import deque
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "robo_resume"

Edge = tuple[str, str, str]  # (target module, "file:line", kind: top / TYPE_CHECKING / local)


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.Module) -> list[tuple[ast.Import | ast.ImportFrom, str]]:
    """Every import statement of ``tree`` with where it stands (top, TYPE_CHECKING, local)."""
    out: list[tuple[ast.Import | ast.ImportFrom, str]] = []

    def visit(node: ast.AST, kind: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import | ast.ImportFrom):
                out.append((child, kind))
            elif isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
                visit(child, "local")
            elif isinstance(child, ast.If) and _is_type_checking(child.test):
                for stmt in child.body:
                    visit(ast.Module(body=[stmt], type_ignores=[]), "TYPE_CHECKING")
                for stmt in child.orelse:
                    visit(ast.Module(body=[stmt], type_ignores=[]), kind)
            else:
                visit(child, kind)

    visit(tree, "top")
    return out


def import_graph(root: Path, package: str = PACKAGE) -> dict[str, list[Edge]]:
    """Module -> the robo_resume modules it imports, with where (all imports, see the top)."""
    files = sorted((root / package).rglob("*.py"))
    modules = {_module_name(p, root): p for p in files}
    packages = {m for m, p in modules.items() if p.name == "__init__.py"}
    graph: dict[str, list[Edge]] = {}
    for name, path in modules.items():
        here = name if name in packages else name.rpartition(".")[0]  # for relative imports
        edges: list[Edge] = []
        for node, kind in _imports(ast.parse(path.read_text(), filename=str(path))):
            where = f"{path.relative_to(root).as_posix()}:{node.lineno}"
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                if node.level:
                    base = here.split(".")
                    base = base[: len(base) - (node.level - 1)]
                    mod = ".".join(base + ([node.module] if node.module else []))
                else:
                    mod = node.module or ""
                # ``from pkg import sub`` needs the submodule ``pkg.sub`` (pkg, its parent, is
                # imported first anyway); any other name comes from pkg itself
                subs = [f"{mod}.{a.name}" for a in node.names if f"{mod}.{a.name}" in modules]
                targets = subs + ([mod] if len(subs) < len(node.names) else [])
            for t in targets:
                # ``import a.b.c`` runs the packages a and a.b first: count the deepest module
                # the name resolves to (its packages' __init__ edges are theirs to show)
                while t and t not in modules:
                    t = t.rpartition(".")[0]
                if t and t != name:
                    edges.append((t, where, kind))
        graph[name] = edges
    return graph


def find_cycles(graph: dict[str, list[Edge]]) -> list[list[tuple[str, Edge]]]:
    """One shortest cycle per strongly connected component of more than one module.

    Each cycle is a list of ``(module, edge)`` steps, the last edge leading back to the first
    module. Empty when the graph is acyclic.
    """
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    components: list[set[str]] = []
    counter = 0

    def strongconnect(v: str) -> None:  # Tarjan; the graph is a few hundred modules deep at most
        nonlocal counter
        index[v] = low[v] = counter
        counter += 1
        stack.append(v)
        on_stack.add(v)
        for w, _, _ in graph.get(v, ()):
            if w not in index:
                strongconnect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.add(w)
                if w == v:
                    break
            if len(comp) > 1:
                components.append(comp)

    for v in sorted(graph):
        if v not in index:
            strongconnect(v)

    cycles = []
    for comp in components:
        start = min(comp)
        # breadth-first from start back to start, inside the component: a shortest cycle
        prev: dict[str, tuple[str, Edge]] = {}
        queue = deque([start])
        seen = {start}
        end: tuple[str, Edge] | None = None
        while queue and end is None:
            v = queue.popleft()
            for edge in graph[v]:
                w = edge[0]
                if w == start:
                    end = (v, edge)
                    break
                if w in comp and w not in seen:
                    seen.add(w)
                    prev[w] = (v, edge)
                    queue.append(w)
        assert end is not None
        steps = [end]
        while steps[-1][0] != start:
            steps.append(prev[steps[-1][0]])
        cycles.append(steps[::-1])
    return sorted(cycles, key=lambda c: c[0][0])


def describe_cycle(cycle: list[tuple[str, Edge]]) -> str:
    """``a -> b (file:line, kind) -> ... -> a``, one step per line."""
    lines = [cycle[0][0]]
    for _, (target, where, kind) in cycle:
        lines.append(f"  -> {target}   ({where}, {kind} import)")
    return "\n".join(lines)


def test_the_module_import_graph_has_no_cycle():
    graph = import_graph(ROOT)
    assert len(graph) > 50, f"expected the robo_resume modules, found {sorted(graph)}"
    cycles = find_cycles(graph)
    assert not cycles, (
        f"{len(cycles)} import cycle(s) in robo_resume/ (TYPE_CHECKING and function-local "
        "imports count); break each with a Protocol in the lower module (see "
        "robo_resume/stream/loader.py BatchSource):\n\n"
        + "\n\n".join(describe_cycle(c) for c in cycles)
    )


def _write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = root / PACKAGE / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


@pytest.mark.parametrize(
    "files, cycle",
    [
        (  # a circle held by a TYPE_CHECKING import back up
            {
                "__init__.py": "",
                "upper.py": "from .lower import Low\n",
                "lower.py": "from typing import TYPE_CHECKING\n"
                "if TYPE_CHECKING:\n    from .upper import Up\n",
            },
            ["robo_resume.lower", "robo_resume.upper"],
        ),
        (  # a function-local import, and an absolute one
            {
                "__init__.py": "",
                "a.py": "def f():\n    import robo_resume.b\n",
                "b.py": "from robo_resume.a import f\n",
            },
            ["robo_resume.a", "robo_resume.b"],
        ),
        (  # a subpackage __init__ re-exporting the module that imports from the package
            {
                "__init__.py": "",
                "sub/__init__.py": "from .one import X\n",
                "sub/one.py": "from .two import Y\nX = 1\n",
                "sub/two.py": "from ..sub import X as _X\nY = 2\n",
            },
            ["robo_resume.sub", "robo_resume.sub.one", "robo_resume.sub.two"],
        ),
        (  # ``from . import module`` inside a package
            {
                "__init__.py": "",
                "p/__init__.py": "",
                "p/m.py": "from . import n\n",
                "p/n.py": "from .m import thing\n",
            },
            ["robo_resume.p.m", "robo_resume.p.n"],
        ),
    ],
)
def test_the_check_finds_cycles_of_every_kind(tmp_path, files, cycle):
    _write(tmp_path, files)
    found = find_cycles(import_graph(tmp_path))
    assert [sorted(m for m, _ in c) for c in found] == [cycle], [describe_cycle(c) for c in found]


def test_the_check_passes_a_graph_that_points_one_way(tmp_path):
    _write(
        tmp_path,
        {
            "__init__.py": "from .upper import Up\n",
            "upper.py": "from .lower import Low\nfrom . import lower\nUp = 1\n",
            "lower.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
            "    from typing import Protocol\nLow = 1\n",
        },
    )
    graph = import_graph(tmp_path)
    assert graph["robo_resume.upper"][0][0] == "robo_resume.lower"
    assert find_cycles(graph) == []


def private_imports(root: Path, package: str = PACKAGE) -> list[str]:
    """``file:line: from M import _name`` for every underscore name imported from another
    module of ``package`` (``_`` means private to its module; dunders are not private)."""
    found = []
    for path in sorted((root / package).rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if not isinstance(node, ast.ImportFrom):
                continue
            inside = node.level > 0 or (node.module or "").split(".")[0] == package
            for alias in node.names if inside else ():
                if alias.name.startswith("_") and not alias.name.startswith("__"):
                    where = path.relative_to(root).as_posix()
                    found.append(
                        f"{where}:{node.lineno}: from {'.' * node.level}"
                        f"{node.module or ''} import {alias.name}"
                    )
    return found


def test_no_underscore_name_is_imported_across_modules():
    found = private_imports(ROOT)
    assert not found, (
        "underscore names are private to their module; give a name used elsewhere no leading "
        "underscore (or move it to where it is used):\n" + "\n".join(found)
    )


def test_the_private_import_check_finds_them(tmp_path):
    _write(
        tmp_path,
        {
            "__init__.py": "from .a import __version__\n",
            "a.py": "__version__ = '1'\n_secret = 1\nfrom os.path import _get_sep\n",
            "b.py": "from .a import _secret\nfrom robo_resume.a import _secret as s\n",
        },
    )
    assert private_imports(tmp_path) == [
        f"{PACKAGE}/b.py:1: from .a import _secret",
        f"{PACKAGE}/b.py:2: from robo_resume.a import _secret",
    ]
