"""The package's five wings and the one direction of their imports.

``bulk/`` -> ``http/`` -> ``runtime/`` -> ``calibration/`` -> ``decide/``: a module may import its own wing and those to
its right, never one to its left, and the package's ``__init__`` (the plugin API) only ``decide/``.
No cycle between modules, nor between folders (a folder's files never import a folder that imports
them, its own subfolders included). Every import of the package counts: at module level, inside a
function and under TYPE_CHECKING.
Read from the source with ``ast`` (tools/checks/structure.py's import graph), so nothing is
imported to check it."""

from __future__ import annotations

from tools.checks.structure import NAME, cycles, graph, imports_of

WINGS = (
    "decide",
    "calibration",
    "runtime",
    "http",
    "bulk",
)  # each may import those before it


def short(module: str) -> str:
    """``module`` relative to the package ("" for the package itself)."""
    return module[len(NAME) + 1 :]


EDGES, _ = graph(runtime_only=False)
GRAPH = {short(m): {short(t) for t in targets} for m, targets in EDGES.items()}
MODULES = set(GRAPH)


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
    assert against == [], (
        "imports against bulk -> http -> runtime -> calibration -> decide:\n"
        + ("\n".join(against))
    )


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


def folder(module: str) -> str:
    """The folder ``module`` is a file of: a package's ``__init__`` is in the package's own folder."""
    if any(other.startswith(module + ".") for other in MODULES) or not module:
        return module
    return module.rpartition(".")[0]


def test_no_cycle_between_folders():
    between: dict[str, set[str]] = {folder(m): set() for m in MODULES}
    for module, targets in GRAPH.items():
        between[folder(module)].update(
            folder(t) for t in targets if folder(t) != folder(module)
        )
    assert cycles(between) == []


def test_the_check_sees_imports_in_functions_and_under_type_checking(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        f"    from {NAME}.http.wire import body\n"
        "def f():\n"
        "    from ..runtime.startup import build_service\n"
        "    return build_service\n"
    )
    found = imports_of(bad, f"{NAME}.decide.bad", set(EDGES))
    assert {short(t) for t in found} == {"http.wire.body", "runtime.startup"}
