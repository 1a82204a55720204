"""The package's three wings and the one direction of their imports.

``bulk/`` -> ``http/`` -> ``runtime/`` -> ``decide/``: a module may import its own wing and those to
its right, never one to its left, and the package's ``__init__`` (the plugin API) only ``decide/``.
Every import of the package counts: at module level, inside a function and under TYPE_CHECKING.
Read from the source with ``ast``, so nothing is imported to check it."""

from __future__ import annotations

import ast
from pathlib import Path

from ..conftest import OVERLAY

PACKAGE = "vllm.entrypoints.generate.decisions"
WINGS = ("decide", "runtime", "http", "bulk")  # each may import those before it


def module_of(path: Path) -> str:
    parts = list(path.relative_to(OVERLAY).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def imports_of(path: Path, module: str) -> set[str]:
    """The package's modules (relative to it) that ``path``, module ``module``, imports, wherever
    the import is."""
    here = module.split(".") if module else []
    package = here if path.name == "__init__.py" else here[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                target = ".".join([*base, *([node.module] if node.module else [])])
            elif node.module and (
                node.module == PACKAGE or node.module.startswith(PACKAGE + ".")
            ):
                target = node.module[len(PACKAGE) + 1 :]
            else:
                continue
            for alias in node.names:
                sub = f"{target}.{alias.name}".strip(".")
                found.add(sub if sub in MODULES else target)
        elif isinstance(node, ast.Import):
            found.update(
                alias.name[len(PACKAGE) + 1 :]
                for alias in node.names
                if alias.name.startswith(PACKAGE + ".")
            )
    return {name for name in found if name != module}


MODULES = {module_of(path): path for path in sorted(OVERLAY.rglob("*.py"))}
GRAPH = {module: imports_of(path, module) for module, path in MODULES.items()}


def wing(module: str) -> str:
    return module.split(".")[0]


def test_every_module_is_in_a_wing():
    outside = [m for m in MODULES if m and wing(m) not in WINGS]
    assert outside == [], f"modules outside {WINGS}: {outside}"


def test_imports_run_one_way():
    against = [
        f"{module} imports {target}"
        for module, targets in GRAPH.items()
        for target in sorted(targets)
        if (
            WINGS.index(wing(target)) > WINGS.index(wing(module))
            if module
            else wing(target) != "decide"
        )
    ]
    assert against == [], "imports against bulk -> http -> runtime -> decide:\n" + (
        "\n".join(against)
    )


def cycles(graph: dict[str, set[str]]) -> list[set[str]]:
    """Strongly connected components of more than one node (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[set[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in graph.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = set()
            while True:
                top = stack.pop()
                component.add(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(component)

    for node in graph:
        if node not in index:
            visit(node)
    return found


def test_no_cycle_between_modules():
    assert cycles(GRAPH) == []


def test_no_cycle_between_wings():
    between: dict[str, set[str]] = {}
    for module, targets in GRAPH.items():
        if module:
            between.setdefault(wing(module), set()).update(
                wing(t) for t in targets if wing(t) != wing(module)
            )
    assert cycles(between) == []


def test_the_check_sees_imports_in_functions_and_under_type_checking(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        f"    from {PACKAGE}.http.wire import body\n"
        "def f():\n"
        "    from ..runtime.startup import build_service\n"
        "    return build_service\n"
    )
    assert imports_of(bad, "decide.bad") == {"http.wire.body", "runtime.startup"}
