"""The scope of a cursor (``Infill.scope``): the language server sends it, the engine picks its canvas by it, and
training draws each example's canvas by the same rule."""

from __future__ import annotations

import pytest

from diffgemma_engine.shared.protocol import Scope, cursor_scope


@pytest.mark.parametrize(
    ("prefix", "scope"),
    [
        ("def f():\n    return x +", Scope.LINE),
        ("def f():\n    ", Scope.BLOCK),
        ("def f():", Scope.BLOCK),
        ("if (x) {", Scope.BLOCK),
        ("print(", Scope.BLOCK),
        ("x = compute(a, b)", Scope.LINE),
        ("", Scope.BLOCK),
    ],
)
def test_cursor_scope(prefix: str, scope: Scope) -> None:
    assert cursor_scope(prefix) == scope


def test_cursor_scope_reads_only_the_cursor_line() -> None:
    assert cursor_scope("x = 1\nif (x) {\n    y = f(x") == Scope.LINE
    assert cursor_scope("x = compute(a, b)\n") == Scope.BLOCK
