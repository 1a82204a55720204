"""Structure figures of the overlay package: modules, lines, import cycles and module-level mutable state.

Import cycles count every import of the package by another of its modules, at module level, inside
functions and under TYPE_CHECKING alike (``--runtime`` leaves the TYPE_CHECKING ones out). Module-level
mutable state: names bound at module level to a dict, list or set (display, comprehension or call), a
ContextVar, or an instance of a mutable class of the package (a registry); a name in capitals holding a
table nobody writes to is listed apart as a constant table, and ``__all__`` is left out.

usage: python -m tools.checks.structure [--runtime]
"""

from __future__ import annotations

import argparse
import ast
from pathlib import Path

PACKAGE = (
    Path(__file__).resolve().parents[2] / "overlay/vllm/entrypoints/generate/decisions"
)
NAME = "vllm.entrypoints.generate.decisions"
MUTABLE_CALLS = {
    "dict",
    "list",
    "set",
    "defaultdict",
    "OrderedDict",
    "ContextVar",
    "deque",
    "WeakValueDictionary",
}
REGISTRIES = {
    "Registry"
}  # the package's own classes whose instances change after import


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join([NAME, *parts])


def resolve(
    current: str, is_package: bool, node: ast.ImportFrom, modules: set[str]
) -> list[str]:
    """The modules ``node`` imports: each name that is a module itself (``from . import laya_prompts``),
    else the module the names come from."""
    if node.level == 0:
        base = node.module or ""
    else:
        parts = current.split(".")
        keep = len(parts) - node.level + (1 if is_package else 0)
        base = ".".join(parts[:keep] + ([node.module] if node.module else []))
    submodules = [
        f"{base}.{alias.name}"
        for alias in node.names
        if f"{base}.{alias.name}" in modules
    ]
    return submodules if len(submodules) == len(node.names) else [base, *submodules]


def under_type_checking(tree: ast.AST) -> set[int]:
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.body:
                lines.update(
                    range(child.lineno, (child.end_lineno or child.lineno) + 1)
                )
    return lines


def imports_of(
    path: Path, name: str, modules: set[str], runtime_only: bool = False
) -> set[str]:
    """The package's modules that module ``name`` (at ``path``) imports, wherever the import is:
    at module level, in a function, and under TYPE_CHECKING unless ``runtime_only``."""
    tree = ast.parse(path.read_text())
    skip = under_type_checking(tree) if runtime_only else set()
    found: set[str] = set()
    for node in ast.walk(tree):
        if getattr(node, "lineno", None) in skip:
            continue
        targets: list[str] = []
        if isinstance(node, ast.ImportFrom):
            targets = resolve(name, path.name == "__init__.py", node, modules)
        elif isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        found.update(t for t in targets if t in modules and t != name)
    return found


def graph(runtime_only: bool) -> tuple[dict[str, set[str]], dict[str, int]]:
    modules = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    edges = {
        name: imports_of(path, name, set(modules), runtime_only)
        for name, path in modules.items()
    }
    lines = {name: len(path.read_text().splitlines()) for name, path in modules.items()}
    return edges, lines


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in edges:
        if v not in index:
            visit(v)
    return found


def mutable_state() -> tuple[list[str], list[str]]:
    trees = {p: ast.parse(p.read_text()) for p in PACKAGE.rglob("*.py")}
    found: list[str] = []
    tables: list[str] = []
    for path, tree in sorted(trees.items()):
        for node in tree.body:
            if not isinstance(node, ast.Assign | ast.AnnAssign) or node.value is None:
                continue
            value = node.value
            mutable = isinstance(
                value,
                ast.Dict
                | ast.List
                | ast.Set
                | ast.DictComp
                | ast.ListComp
                | ast.SetComp,
            )
            if isinstance(value, ast.Call):
                callee = ast.unparse(value.func).split(".")
                mutable = callee[-1] in MUTABLE_CALLS or any(
                    part in REGISTRIES for part in callee
                )
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names = [ast.unparse(t) for t in targets]
            if not mutable or names == ["__all__"]:
                continue
            constant = all(n.isupper() for n in names) and not isinstance(
                value, ast.Call
            )
            where = f"{path.relative_to(PACKAGE)}:{node.lineno} {', '.join(names)}"
            (tables if constant else found).append(where)
    return found, tables


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--runtime", action="store_true", help="leave out imports under TYPE_CHECKING"
    )
    args = parser.parse_args()
    edges, lines = graph(args.runtime)
    print(f"modules: {len(lines)}, lines: {sum(lines.values())}")
    found = cycles(edges)
    print(
        f"import cycles: {len(found)}"
        + "".join(f"\n  {len(c)} modules: {', '.join(c)}" for c in found)
    )
    state, tables = mutable_state()
    print(
        f"module-level mutable state: {len(state)}" + "".join(f"\n  {s}" for s in state)
    )
    print(f"constant tables (capitals, never written): {len(tables)}")


if __name__ == "__main__":
    main()
