"""The package's import graph, walked from the source: no module imports a module that
imports it back, directly or through others (imports inside functions and under
``TYPE_CHECKING`` count: they are couplings too). The graph is grimp's, which import-linter
also reads; the layers between packages are import-linter's contract (``[tool.importlinter]``
in pyproject.toml, run by ``lint-imports`` in CI)."""

from __future__ import annotations

import grimp

import raysearch


def import_graph() -> dict[str, set[str]]:
    """Module -> the raysearch modules it imports, as grimp (import-linter's graph) reads them
    from the source: every import statement, in functions and under ``TYPE_CHECKING`` too."""
    graph = grimp.build_graph(raysearch.__name__)
    return {m: set(graph.find_modules_directly_imported_by(m)) for m in graph.modules}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in sorted(graph[node]):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                other = stack.pop()
                on_stack.discard(other)
                component.append(other)
                if other == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_graph_is_read_from_the_source():
    graph = import_graph()
    assert "raysearch.cli" in graph and graph["raysearch.cli"]
    # An import inside a function counts (the built-in paths ask the demo on first use).
    assert "raysearch.demo" in graph["raysearch.config.builtin_paths"]
    assert all(t in graph for targets in graph.values() for t in targets)


def test_the_walk_finds_a_cycle_when_there_is_one():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]


def test_no_module_imports_a_module_that_imports_it_back():
    found = cycles(import_graph())
    assert found == [], "import cycles:\n" + "\n".join(" <-> ".join(c) for c in found)
