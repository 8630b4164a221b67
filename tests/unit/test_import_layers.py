"""The import graph of ddpdoctor/ and checks/ has no cycle, and each side imports only what the README's
"Architecture" section allows it.

The graph is read with ``ast``, not by importing: an edge is an import at module level (in the
module's body, a class body, or under ``if``/``try``/``with``, ``if TYPE_CHECKING:`` included). An
import inside a function runs only when it is called and is no edge. An import names the module it
imports, not the packages above it (``from ddpdoctor.analysis.facts import ddp`` is an edge to
``ddpdoctor.analysis.facts.ddp`` only).
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Iterator, Union

ROOT = Path(__file__).resolve().parents[2]

# (importer prefix, imported prefixes it may import from ddpdoctor). Everything else of ddpdoctor is
# forbidden to it; the standard library and third-party packages are not judged here.
ALLOWED = {
    # pure: evidence in, report out; plugins.py (entry-point discovery) belongs to no side
    "ddpdoctor.analysis": ("ddpdoctor.analysis", "ddpdoctor.schema", "ddpdoctor.plugins"),
    # the checks are the analysis side too, and never import each other (only their _helpers)
    "ddpdoctor.checks": ("ddpdoctor.analysis", "ddpdoctor.schema", "ddpdoctor.checks._"),
    # the contracts between the sides
    "ddpdoctor.schema": ("ddpdoctor.schema",),
}
# Sides that a side must never import at module level (a rank process imports what it needs late).
FORBIDDEN = {
    "ddpdoctor.rank": ("ddpdoctor.analysis", "ddpdoctor.supervisor", "ddpdoctor.postmortem"),
}
# Edges that break a rule above on purpose: (importer, imported) -> why. None today.
EXCEPTIONS: dict[tuple[str, str], str] = {}

ImportNode = Union[ast.Import, ast.ImportFrom]


def _modules() -> dict[str, Path]:
    """Module name -> its file, checks/ named as installed (ddpdoctor.checks)."""
    out: dict[str, Path] = {}
    for path in sorted((ROOT / "ddpdoctor").rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    for path in sorted((ROOT / "checks").glob("*.py")):
        out["ddpdoctor.checks" if path.stem == "__init__" else f"ddpdoctor.checks.{path.stem}"] = path
    return out


def _module_level_imports(body: list[ast.stmt]) -> Iterator[ImportNode]:
    for node in body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for name in ("body", "orelse", "finalbody", "handlers", "cases"):
                yield from _module_level_imports(getattr(node, name, None) or [])


def _targets(node: ImportNode, module: str, is_package: bool, modules: dict[str, Path]) -> Iterator[str]:
    if isinstance(node, ast.Import):
        yield from (alias.name for alias in node.names)
        return
    if node.level:
        base = module if is_package else module.rpartition(".")[0]
        for _ in range(node.level - 1):
            base = base.rpartition(".")[0]
        source = f"{base}.{node.module}" if node.module else base
    else:
        source = node.module or ""
    for alias in node.names:
        yield f"{source}.{alias.name}" if f"{source}.{alias.name}" in modules else source


def import_graph() -> dict[str, set[str]]:
    """Module -> the ddpdoctor modules it imports at module level."""
    modules = _modules()
    graph: dict[str, set[str]] = {}
    for module, path in modules.items():
        edges = set()
        for node in _module_level_imports(ast.parse(path.read_text(encoding="utf-8")).body):
            for target in _targets(node, module, path.name == "__init__.py", modules):
                while target and target not in modules:  # an attribute of a module: the module
                    target = target.rpartition(".")[0]
                if target and target != module:
                    edges.add(target)
        graph[module] = edges
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def _within(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix if prefix.endswith("_") else prefix + ".")


def test_the_graph_sees_module_level_imports_only():
    graph = import_graph()
    assert "ddpdoctor.analysis.facts.derived" in graph["ddpdoctor.analysis.interruption"]
    assert "ddpdoctor.analysis.evidence" in graph["ddpdoctor.checks.rank_failure"]
    assert "ddpdoctor.checks._common" in graph["ddpdoctor.checks.rank_failure"]  # a relative import
    assert "ddpdoctor.analysis.evidence" in graph["ddpdoctor.analysis.api"]  # under TYPE_CHECKING


def test_the_import_graph_has_no_cycle():
    assert cycles(import_graph()) == []


def test_a_cycle_is_found_and_named():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert cycles(graph) == [["a", "b", "c"]]


def test_evidence_knows_nothing_of_the_facts_derived_from_it():
    assert not {m for m in import_graph()["ddpdoctor.analysis.evidence"] if _within(m, "ddpdoctor.analysis.facts")}


def test_each_side_imports_only_what_it_may():
    broken = []
    for module, imported in sorted(import_graph().items()):
        for target in sorted(t for t in imported if (module, t) not in EXCEPTIONS):
            for side, allowed in ALLOWED.items():
                if _within(module, side) and not any(_within(target, a) for a in allowed):
                    broken.append(f"{module} -> {target}")
            for side, forbidden in FORBIDDEN.items():
                if _within(module, side) and any(_within(target, f) for f in forbidden):
                    broken.append(f"{module} -> {target}")
    assert broken == []
