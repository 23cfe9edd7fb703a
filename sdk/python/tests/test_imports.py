"""The SDK's modules import each other without a cycle (issue 34).

Every import counts, a function's own included (a cycle through a
function-local import still ties the modules together: neither can be
understood, tested or moved without the other); only imports under
``if TYPE_CHECKING:`` (annotations) do not. The shared pieces live in
leaves that import nothing of the package but ``errors``."""

from __future__ import annotations

import ast
import pathlib

import ziptrail

PACKAGE = pathlib.Path(ziptrail.__file__).parent
LEAVES = {"errors", "_objects", "_current"}


def _type_checking(node: ast.If) -> bool:
    t = node.test
    return isinstance(t, ast.Name) and t.id == "TYPE_CHECKING" or isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING"


def _imports(tree: ast.AST, modules: set[str]) -> set[str]:
    """The package's modules a module's code imports."""
    out: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _type_checking(node):
            for n in node.orelse:
                visit(n)
            return
        if isinstance(node, ast.ImportFrom):
            if node.level == 1 and node.module:  # from .x import ...
                out.add(node.module.split(".")[0])
            elif node.level == 1:  # from . import x, y
                out.update(a.name for a in node.names)
            elif node.module and node.module.split(".")[0] == "ziptrail":
                parts = node.module.split(".")
                out.update([parts[1]] if len(parts) > 1 else [a.name for a in node.names])
        elif isinstance(node, ast.Import):
            for a in node.names:
                parts = a.name.split(".")
                if parts[0] == "ziptrail" and len(parts) > 1:
                    out.add(parts[1])
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return {m for m in out if m in modules}


def _graph() -> dict[str, set[str]]:
    files = {p.stem: p for p in PACKAGE.glob("*.py")}
    modules = set(files) | {"_proto"}
    graph = {name: _imports(ast.parse(p.read_text()), modules) - {name} for name, p in files.items()}
    graph.pop("__init__")  # the package's front: it imports everything, nothing imports it
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str]:
    """A cycle of graph, as the modules along it; [] when there is none."""
    state: dict[str, int] = {}  # 1: on the path, 2: done
    path: list[str] = []

    def dfs(m: str) -> list[str]:
        state[m] = 1
        path.append(m)
        for n in sorted(graph.get(m, ())):
            if state.get(n) == 1:
                return path[path.index(n):] + [n]
            if n not in state and (c := dfs(n)):
                return c
        state[m] = 2
        path.pop()
        return []

    for m in sorted(graph):
        if m not in state and (c := dfs(m)):
            return c
    return []


def test_the_modules_import_each_other_without_a_cycle():
    graph = _graph()
    assert {"client", "group", "server", "_fastmsg", "_direct", "_reduce"} <= set(graph), "the walk found the modules"
    cycle = _cycle(graph)
    assert not cycle, "import cycle: " + " -> ".join(cycle)


def test_the_leaves_import_only_errors():
    graph = _graph()
    for leaf in sorted(LEAVES):
        assert graph[leaf] <= {"errors"} - {leaf}, f"{leaf} imports {sorted(graph[leaf])}: a leaf imports nothing of the package but errors"


def test_the_cycle_finder_finds_one():
    # A function-local import closing a circle is one, a TYPE_CHECKING one not.
    src = {
        "a": "from . import b\n",
        "b": "def f():\n    from .c import x\n",
        "c": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .a import y\ndef g():\n    from .a import z\n",
    }
    modules = set(src)
    graph = {m: _imports(ast.parse(s), modules) for m, s in src.items()}
    assert _cycle(graph) == ["a", "b", "c", "a"]
    graph["c"] = _imports(ast.parse(src["c"].replace("def g():\n    from .a import z\n", "")), modules)
    assert _cycle(graph) == []
