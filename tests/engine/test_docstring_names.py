"""Docstrings name modules a reader can import (issue 28): ``diffgemma_engine.X``, not the folder's name
``engine.X``, and every ``diffgemma_engine...`` or ``diffgemma_lsp...`` name in double backticks resolves."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SOURCES = sorted([*(ROOT / "engine").rglob("*.py"), *(ROOT / "diffgemma_lsp").rglob("*.py")])
NAME = re.compile(r"``((?:diffgemma_engine|diffgemma_lsp)(?:\.\w+)+)(?:\(\))?``")


def _resolves(dotted: str) -> bool:
    """Whether ``dotted`` is a module, or an attribute (a class's too) reached from the longest importable module."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            target: object = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attribute in parts[cut:]:
            if not hasattr(target, attribute):
                annotations = getattr(target, "__annotations__", {})
                fields = getattr(target, "__attrs_attrs__", ()) or getattr(target, "__dataclass_fields__", {})
                named = {getattr(field, "name", field) for field in fields}
                return attribute in annotations or attribute in named
            target = getattr(target, attribute)
        return True
    return False


def test_no_docstring_names_the_folder_instead_of_the_package() -> None:
    wrong = [
        f"{path.relative_to(ROOT)}:{number}"
        for path in SOURCES
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if re.search(r"``engine\.(?!(stderr|log|sock|vllm\.sock)``)", line)  # a file named engine.X is fine
    ]
    assert wrong == []


def test_every_named_module_and_attribute_resolves() -> None:
    names = {match for path in SOURCES for match in NAME.findall(path.read_text())}
    assert len(names) > 50, len(names)
    unresolved = sorted(name for name in names if not _resolves(name))
    assert unresolved == []
