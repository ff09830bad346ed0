"""Module docstrings state a module's invariants in at most 15 lines; long explanations
live in docs/ (a module points to its section there)."""

from __future__ import annotations

import ast
from pathlib import Path

import radixlm

ROOT = Path(radixlm.__file__).parent
MAX_LINES = 15


def docstring_lines(path: Path) -> int:
    doc = ast.get_docstring(ast.parse(path.read_text(), str(path)), clean=False)
    return len(doc.splitlines()) if doc else 0


def test_the_count_includes_every_line(tmp_path: Path) -> None:
    f = tmp_path / "m.py"
    f.write_text('"""one\n\ntwo\nthree\n"""\nx = 1\n')
    assert docstring_lines(f) == 4
    f.write_text("x = 1\n")
    assert docstring_lines(f) == 0


def test_no_module_docstring_is_longer_than_15_lines() -> None:
    long = {str(p.relative_to(ROOT.parent)): n for p in sorted(ROOT.rglob("*.py"))
            if (n := docstring_lines(p)) > MAX_LINES}
    assert not long, f"module docstrings over {MAX_LINES} lines (move the prose to docs/): {long}"
