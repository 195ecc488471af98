"""The structure stays measurable: imports point down the layers of ``bertforge.core.layers``
and never in a cycle between the package's modules (imports inside functions count, and so does
every ``Ref("module", ...)`` of the registries, which is an import made later), no function over
100 lines, no module over 600.

Read from the source with ``ast``, not by importing anything, so the check is exact and fast.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Iterator

from bertforge.core.layers import LAYERS, layer_of

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


def import_sites() -> Iterator[tuple[str, str, int, str]]:
    """(importing module, its file relative to the repository, line, imported module) of every
    import of another bertforge module, named by the deepest module it names; a package's
    ``__init__`` is not counted as imported by its own submodules."""
    files = modules()
    for mod, path in files.items():
        where = str(path.relative_to(PACKAGE.parents[1]))
        for node in ast.walk(ast.parse(path.read_text())):
            for target in imported(mod, node, path.name == "__init__.py"):
                while target and target not in files:  # the deepest module it names
                    target = target.rpartition(".")[0]
                if target.startswith("bertforge") and target != mod and \
                        not mod.startswith(target + "."):
                    yield mod, where, node.lineno, target


def import_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {m: set() for m in modules()}
    for mod, _, _, target in import_sites():
        graph[mod].add(target)
    return graph


def upward_imports() -> list[str]:
    """``file:line imports module (layer i > layer j)`` for each import that points up."""
    def named(i: int | None) -> str:
        return "unplaced" if i is None else f"layer {i} {'/'.join(LAYERS[i])}"

    found = set()
    for mod, where, line, target in import_sites():
        low, high = layer_of(mod), layer_of(target)
        if low is None or high is None or high > low:
            found.add(f"{where}:{line} imports {target} ({named(high)} is above "
                      f"{mod}'s {named(low)})")
    return sorted(found)


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


def test_imports_point_down_the_layers() -> None:
    """Every import (lazy ones and registry refs included) stays in its layer or goes below:
    the list of ``bertforge.core.layers.LAYERS`` is the one statement of the order."""
    upward = upward_imports()
    assert not upward, "imports that point up the layers (bertforge/core/layers.py):\n" + \
        "\n".join(upward)


def test_every_module_is_placed_and_every_entry_exists() -> None:
    """A new top-level package or module fails until LAYERS says where it sits; an entry left
    behind by a rename fails too."""
    names = {m.removeprefix("bertforge").removeprefix(".") or "__init__" for m in modules()}
    unplaced = sorted(n for n in names if layer_of(n) is None)
    assert not unplaced, f"not placed in bertforge/core/layers.py LAYERS: {', '.join(unplaced)}"
    entries = [e for layer in LAYERS for e in layer]
    assert len(entries) == len(set(entries)), "an entry of LAYERS is in two layers"
    missing = sorted(e for e in entries if e not in names)
    assert not missing, f"LAYERS names modules that do not exist: {', '.join(missing)}"


def test_an_upward_import_is_found_and_named(monkeypatch) -> None:
    """The check is not blind: a lazy import of the runner from the models is reported with its
    file, line and the module it imports."""
    import sys

    here = sys.modules[__name__]
    sites = [("bertforge.models.bert", "src/bertforge/models/bert.py", 7, "bertforge.train.run"),
             ("bertforge.train.run", "src/bertforge/train/run.py", 9, "bertforge.models.bert")]
    monkeypatch.setattr(here, "import_sites", lambda: iter(sites))
    [message] = upward_imports()
    assert message.startswith("src/bertforge/models/bert.py:7 imports bertforge.train.run (layer ")
    assert layer_of("bertforge.tasks.registry") > layer_of("bertforge.tasks.squad") > \
        layer_of("bertforge.train.run") > layer_of("bertforge.models.bert")
    assert layer_of("bertforge.nothing_placed") is None and layer_of("bertforge") is not None
