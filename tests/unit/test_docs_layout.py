"""The documentation's structure: docs/layout.md lists exactly the package's modules, and every relative
link in the Markdown pages points at a file that exists (and, for a link into a page, a heading in it)."""

from __future__ import annotations

import re
from pathlib import Path

from ..conftest import OVERLAY, ROOT

LAYOUT = ROOT / "docs" / "layout.md"
PAGES = sorted(
    [
        ROOT / "README.md",
        ROOT / "CHANGELOG.md",
        *(ROOT / "docs").glob("*.md"),
        *(ROOT / "backends").glob("*.md"),
        ROOT / "tools" / "README.md",
    ]
)

FENCE = re.compile(r"^```.*?^```", re.M | re.S)
INLINE_CODE = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.M)


def package_section(text: str) -> str:
    """docs/layout.md's "## The package" section, up to the next second-level heading."""
    start = text.index("\n## The package\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else len(text)]


def listed_modules() -> list[str]:
    """The module entries: list items that start with a backticked path ending in .py."""
    return re.findall(r"^- `([^`]+\.py)`", package_section(LAYOUT.read_text()), re.M)


def package_modules() -> set[str]:
    return {
        p.relative_to(OVERLAY).as_posix()
        for p in OVERLAY.rglob("*.py")
        if "__pycache__" not in p.parts
    }


def test_layout_lists_every_module_once():
    listed = listed_modules()
    assert len(listed) == len(set(listed)), (
        f"listed twice in docs/layout.md: {sorted({m for m in listed if listed.count(m) > 1})}"
    )
    actual = package_modules()
    missing = sorted(actual - set(listed))
    stale = sorted(set(listed) - actual)
    assert not missing, f"modules missing from docs/layout.md: {missing}"
    assert not stale, f"docs/layout.md lists modules that don't exist: {stale}"


def anchor(heading: str) -> str:
    """GitHub's anchor for a heading: its text (link targets and code marks dropped), lowercased, every
    character but letters, digits, '_', '-' and spaces dropped, spaces turned into '-'."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).lower()
    return "".join("-" if c == " " else c for c in text if c.isalnum() or c in " -_")


def anchors(page: Path) -> set[str]:
    """Every heading's anchor in ``page``; a repeated heading gets -1, -2, ... as on GitHub."""
    found: set[str] = set()
    for heading in HEADING.findall(FENCE.sub("", page.read_text())):
        slug = base = anchor(heading)
        count = 0
        while slug in found:
            count += 1
            slug = f"{base}-{count}"
        found.add(slug)
    return found


def relative_links(page: Path) -> list[str]:
    """Link targets in ``page`` outside code, other than web addresses."""
    text = INLINE_CODE.sub("", FENCE.sub("", page.read_text()))
    return [t for t in LINK.findall(text) if not re.match(r"[a-z][a-z0-9+.-]*:", t)]


def test_relative_links_resolve():
    broken = []
    for page in PAGES:
        for link in relative_links(page):
            path, _, fragment = link.partition("#")
            target = (page.parent / path).resolve() if path else page
            if not target.exists():
                broken.append(f"{page.relative_to(ROOT)}: {link} (no such file)")
            elif (
                fragment and target.suffix == ".md" and fragment not in anchors(target)
            ):
                broken.append(
                    f"{page.relative_to(ROOT)}: {link} (no heading with that anchor)"
                )
    assert not broken, "broken links:\n" + "\n".join(broken)


def test_anchor_rules():
    assert anchor("The default: `rotate`") == "the-default-rotate"
    assert (
        anchor("Answers that don't depend on option order")
        == "answers-that-dont-depend-on-option-order"
    )
    assert (
        anchor("`POST /v1/systemone` and `/api/alpha/decisions`")
        == "post-v1systemone-and-apialphadecisions"
    )
    assert anchor("VLLM_TYPED_DECISIONS_DEBIAS") == "vllm_typed_decisions_debias"


TOOLS = ROOT / "tools"
TOOLS_INDEX = TOOLS / "README.md"


def tools_index_sections() -> dict[str, str]:
    """tools/README.md by folder: "" for the text before the first "## folder/" heading."""
    parts = re.split(r"^## (\w+)/.*$", TOOLS_INDEX.read_text(), flags=re.M)
    return {"": parts[0], **dict(zip(parts[1::2], parts[2::2], strict=True))}


def test_tools_index_lists_every_tool_once_under_its_folder():
    sections = tools_index_sections()
    listed = {
        (folder, name)
        for folder, text in sections.items()
        for row in re.findall(r"^\| (`[^|]+`) \|", text, re.M)
        for name in re.findall(r"`([^`]+)`", row)
    }
    files = set()
    for path in TOOLS.rglob("*"):
        if path.is_dir() or "__pycache__" in path.parts or path.name == "__init__.py":
            continue
        if path == TOOLS_INDEX:
            continue
        parts = path.relative_to(TOOLS).parts
        folder, name = (
            ("", parts[0]) if len(parts) == 1 else (parts[0], "/".join(parts[1:]))
        )
        files.add((folder, name))
    assert sorted(files - listed) == [], "tools missing from tools/README.md"
    assert sorted(listed - files) == [], "tools/README.md lists files that don't exist"


def test_tools_index_commands_name_existing_modules():
    modules = re.findall(r"python -m (tools(?:\.\w+)+)", TOOLS_INDEX.read_text())
    assert modules
    missing = [
        m for m in modules if not (ROOT / (m.replace(".", "/") + ".py")).exists()
    ]
    assert missing == []
