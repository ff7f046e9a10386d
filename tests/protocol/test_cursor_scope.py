"""The scope of a cursor (``Infill.scope``): the language server sends it, the engine picks its canvas by it, and
training draws each example's canvas by the same rule."""

from __future__ import annotations

import pytest

from diffgemma_engine.protocol import SCOPE_BLOCK, SCOPE_LINE, cursor_scope


@pytest.mark.parametrize(
    ("prefix", "scope"),
    [
        ("def f():\n    return x +", SCOPE_LINE),
        ("def f():\n    ", SCOPE_BLOCK),
        ("def f():", SCOPE_BLOCK),
        ("if (x) {", SCOPE_BLOCK),
        ("print(", SCOPE_BLOCK),
        ("x = compute(a, b)", SCOPE_LINE),
        ("", SCOPE_BLOCK),
    ],
)
def test_cursor_scope(prefix: str, scope: str) -> None:
    assert cursor_scope(prefix) == scope


def test_cursor_scope_reads_only_the_cursor_line() -> None:
    assert cursor_scope("x = 1\nif (x) {\n    y = f(x") == SCOPE_LINE
    assert cursor_scope("x = compute(a, b)\n") == SCOPE_BLOCK
