"""The structure stays measurable: no import cycles between the package's modules (imports inside
functions count, and so does every ``Ref("module", ...)`` of the registries, which is an import
made later), no function over 100 lines, no module over 600.

Read from the source with ``ast``, not by importing anything, so the check is exact and fast.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "bertforge"
MAX_FUNCTION, MAX_MODULE = 100, 600


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in PACKAGE.rglob("*.py")}


def imported(name: str, node: ast.AST, is_package: bool) -> list[str]:
    """The module names an import statement or a ``Ref(...)`` call names."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if isinstance(node, ast.ImportFrom):
        base = node.module or ""
        if node.level:
            parts = name.split(".") if is_package else name.split(".")[:-1]
            parts = parts[: len(parts) - (node.level - 1)]
            base = ".".join(parts + ([node.module] if node.module else []))
        return [base] + [f"{base}.{alias.name}" for alias in node.names]
    if (isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Ref" and node.args
            and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
        return [node.args[0].value]
    return []


def import_graph() -> dict[str, set[str]]:
    files = modules()
    graph: dict[str, set[str]] = {m: set() for m in files}
    for mod, path in files.items():
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            for target in imported(mod, node, path.name == "__init__.py"):
                while target and target not in files:  # the deepest module it names
                    target = target.rpartition(".")[0]
                if target.startswith("bertforge") and target != mod and \
                        not mod.startswith(target + "."):
                    graph[mod].add(target)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), minus a package and its
    own child (an ``__init__`` re-exporting a submodule that imports a sibling of the package)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return [c for c in found if not (len(c) == 2 and c[1].startswith(c[0] + "."))]


def test_no_import_cycles_lazy_imports_and_registry_refs_included() -> None:
    assert cycles(import_graph()) == []


def test_registry_refs_are_edges_of_the_graph() -> None:
    """The check would be blind to the registries if it skipped their references."""
    graph = import_graph()
    assert "bertforge.tasks.squad" in graph["bertforge.tasks.registry"]
    assert "bertforge.models.bert" in graph["bertforge.models.registry"]


def test_a_cycle_is_found() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == [["a", "b", "c"]]


def test_no_long_functions_or_modules() -> None:
    long = []
    for mod, path in modules().items():
        text = path.read_text()
        if text.count("\n") + 1 > MAX_MODULE:
            long.append(f"{mod}: {text.count(chr(10)) + 1} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                if lines > MAX_FUNCTION:
                    long.append(f"{mod}.{node.name}: {lines} lines")
    assert long == []
