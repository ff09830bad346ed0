"""docs/architecture.md is the map of the package: every module is named in its folder's
section, every file it names exists there, and every docs page it links exists."""

from __future__ import annotations

import re
from pathlib import Path

import radixlm

PKG = Path(radixlm.__file__).parent
DOCS = PKG.parent / "docs"


def sections() -> dict[str, str]:
    """'### radixlm/<folder>/' heading -> its text, keyed by folder ('' for the root)."""
    text = (DOCS / "architecture.md").read_text()
    parts = re.split(r"^### radixlm/(.*?)/?\s*$", text, flags=re.M)
    return {parts[i].strip("/"): re.split(r"^## ", parts[i + 1], flags=re.M)[0]
            for i in range(1, len(parts), 2)}


def test_every_module_is_on_the_map() -> None:
    secs = sections()
    missing = []
    for path in sorted(PKG.rglob("*.py")):
        rel = path.relative_to(PKG)
        if path.name == "__init__.py":
            continue
        top = rel.parts[0] if len(rel.parts) > 1 else ""
        if f"`{path.name}`" not in secs.get(top, ""):
            missing.append(str(rel))
    assert not missing, f"modules not named in docs/architecture.md: {missing}"


def test_every_file_on_the_map_exists() -> None:
    stale = []
    for top, text in sections().items():
        names = {p.name for p in (PKG / top).rglob("*.py")}
        stale += [f"{top}/{n}" for n in re.findall(r"`([\w/]*?\w+\.py)`", text)
                  if n.split("/")[-1] not in names]
    assert not stale, f"docs/architecture.md names files that do not exist: {stale}"


def test_linked_pages_exist_and_the_map_stays_short() -> None:
    text = (DOCS / "architecture.md").read_text()
    links = re.findall(r"\]\(([\w-]+\.md)\)", text)
    assert links and all((DOCS / link).exists() for link in links), links
    assert len(text.splitlines()) <= 150
