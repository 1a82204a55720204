"""Every ``vllm`` import of the overlay, checked statically against a vLLM source tree.

The overlay is one package for several vLLM versions; where they differ it branches on
``VLLM_RELEASE`` (``vllm_versions.py``), directly or through a flag defined there. This reads the
overlay's sources with :mod:`ast`, takes for a given release only the branches that release runs, and
checks that each imported module exists in the tree and defines (or re-exports) each imported name.
It imports nothing from vLLM, so it also checks a version that can't be installed here (0.33, GPU only).
"""

from __future__ import annotations

import ast
import operator
from dataclasses import dataclass
from pathlib import Path

from ..conftest import OVERLAY

OWN_PACKAGE = "vllm.entrypoints.generate.decisions"
COMPARISONS = {
    ast.GtE: operator.ge,
    ast.Gt: operator.gt,
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
}


@dataclass(frozen=True)
class Import:
    where: str  # file:line in the overlay
    module: str
    name: str | None  # None for ``import module`` or ``from module import *``


def release_flags(release: tuple[int, int]) -> dict[str, bool]:
    """The flags ``vllm_versions.py`` defines as ``NAME = VLLM_RELEASE <op> (major, minor)``, for ``release``."""
    tree = ast.parse((OVERLAY / "decide" / "vllm_versions.py").read_text())
    flags = {}
    for node in tree.body:
        if (
            isinstance(node, ast.Assign)
            and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Name)
        ):
            value = _release_test(node.value, release, {})
            if value is not None:
                flags[node.targets[0].id] = value
    return flags


def _release_test(
    test: ast.expr, release: tuple[int, int], flags: dict[str, bool]
) -> bool | None:
    """The value of a version switch for ``release``; None when ``test`` is not one."""
    if isinstance(test, ast.Name) and test.id in flags:
        return flags[test.id]
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        inner = _release_test(test.operand, release, flags)
        return None if inner is None else not inner
    if (
        isinstance(test, ast.Compare)
        and isinstance(test.left, ast.Name)
        and test.left.id == "VLLM_RELEASE"
        and len(test.ops) == 1
        and type(test.ops[0]) in COMPARISONS
    ):
        bound = ast.literal_eval(test.comparators[0])
        return bool(COMPARISONS[type(test.ops[0])](release, tuple(bound)))
    return None


def overlay_imports(release: tuple[int, int]) -> list[Import]:
    """The overlay's imports of vLLM (not of itself) on the code paths ``release`` runs."""
    flags = release_flags(release)
    found: list[Import] = []
    for path in sorted(OVERLAY.rglob("*.py")):
        where = path.relative_to(OVERLAY)

        def visit(nodes: list[ast.stmt], where: Path = where) -> None:
            for node in nodes:
                if (
                    isinstance(node, ast.If)
                    and (taken := _release_test(node.test, release, flags)) is not None
                ):
                    visit(node.body if taken else node.orelse)
                elif isinstance(node, ast.Import):
                    found.extend(
                        Import(f"{where}:{node.lineno}", a.name, None)
                        for a in node.names
                        if _vllm(a.name)
                    )
                elif isinstance(node, ast.ImportFrom):
                    if node.level == 0 and node.module and _vllm(node.module):
                        found.extend(
                            Import(
                                f"{where}:{node.lineno}",
                                node.module,
                                None if a.name == "*" else a.name,
                            )
                            for a in node.names
                        )
                else:
                    for child in ast.iter_child_nodes(node):
                        if isinstance(child, ast.stmt):
                            visit([child])
                        elif isinstance(child, ast.ExceptHandler):
                            visit(child.body)

        visit(ast.parse(path.read_text()).body)
    return found


def _vllm(module: str) -> bool:
    return module.split(".")[0] == "vllm" and not module.startswith(OWN_PACKAGE)


def module_file(root: Path, module: str) -> Path | None:
    """Where ``module`` lives under the source tree ``root`` (the folder holding ``vllm/``)."""
    base = root.joinpath(*module.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def top_level_names(path: Path) -> tuple[set[str], bool]:
    """The names a module defines at its top level (inside top-level ``if``/``try`` too), and whether it
    has a module ``__getattr__`` (lazy names, which a static check takes on trust)."""
    names: set[str] = set()

    def collect(nodes: list[ast.stmt]) -> None:
        for node in nodes:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                names.add(node.name)
            elif isinstance(node, ast.Assign):
                names.update(
                    n.id
                    for t in node.targets
                    for n in ast.walk(t)
                    if isinstance(n, ast.Name)
                )
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                names.add(node.target.id)
            elif isinstance(node, ast.Import | ast.ImportFrom):
                names.update((a.asname or a.name).split(".")[0] for a in node.names)
            elif isinstance(node, ast.If | ast.Try):
                collect(node.body + node.orelse + getattr(node, "finalbody", []))
                for handler in getattr(node, "handlers", []):
                    collect(handler.body)

    collect(ast.parse(path.read_text()).body)
    return names, "__getattr__" in names


def unresolved(imports: list[Import], root: Path) -> list[str]:
    """The imports that the vLLM sources under ``root`` do not provide, one line each."""
    missing = []
    for imp in imports:
        path = module_file(root, imp.module)
        if path is None:
            missing.append(f"{imp.where}: no module {imp.module}")
            continue
        if (
            imp.name is None
            or module_file(root, f"{imp.module}.{imp.name}") is not None
        ):
            continue
        names, lazy = top_level_names(path)
        if imp.name not in names and not lazy:
            missing.append(f"{imp.where}: {imp.module} has no {imp.name}")
    return missing
