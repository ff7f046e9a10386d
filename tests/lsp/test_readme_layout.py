"""The README's layout tree names every module of the two packages and the benchmarks, and only modules that exist.

The tree is the code block after the ``<!-- layout`` marker in README.md's Development section: two spaces of
indent per level, a folder ends with ``/``, each line's first word is the name.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LISTED_MODULES = ("diffgemma_lsp", "engine", "benchmarks")
"""Folders whose modules are listed one by one (tests/ is listed by folder)."""


def readme_tree() -> set[str]:
    """The paths the README's layout block names."""
    text = (ROOT / "README.md").read_text()
    block = text.split("<!-- layout", 1)[1].split("```", 2)[1]
    paths: set[str] = set()
    folders: list[str] = []
    for line in block.splitlines():
        match = re.match(r"( *)(\S+)", line)
        if not match:
            continue
        depth, name = len(match.group(1)) // 2, match.group(2)
        folders = folders[:depth]
        paths.add("/".join([*folders, name.rstrip("/")]))
        if name.endswith("/"):
            folders.append(name.rstrip("/"))
    return paths


def modules_on_disk() -> set[str]:
    """Every module and package folder under LISTED_MODULES, and the folders under tests/."""
    found: set[str] = set()
    for top in LISTED_MODULES:
        found.add(top)
        for path in (ROOT / top).rglob("*.py"):
            if path.name == "__init__.py" or "__pycache__" in path.parts:
                continue
            relative = path.relative_to(ROOT)
            found.add(str(relative))
            found.update(str(parent) for parent in relative.parents if str(parent) != ".")
    found.add("tests")
    found.update(f"tests/{path.name}" for path in (ROOT / "tests").iterdir() if (path / "__init__.py").is_file())
    return found


def test_the_readme_layout_matches_the_tree_module_for_module() -> None:
    listed, on_disk = readme_tree(), modules_on_disk()
    assert sorted(on_disk - listed) == [], "modules missing from the README's layout"
    assert sorted(listed - on_disk) == [], "the README's layout names modules that do not exist"
