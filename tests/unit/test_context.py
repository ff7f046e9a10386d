"""Context around the cursor: UTF-16 positions, CRLF, clamping, out-of-range lines."""

from __future__ import annotations

import pytest
from lsprotocol import types
from pygls.workspace import TextDocument

from diffgemma_lsp.context import PositionError, build_context, cursor_scope


def _doc(text: str) -> TextDocument:
    return TextDocument("file:///t.py", text, version=4)


def _at(text: str, line: int, character: int, budget: int = 1000):  # noqa: ANN202
    return build_context(_doc(text), types.Position(line=line, character=character), budget)


def test_prefix_and_suffix_split_at_the_cursor() -> None:
    ctx = _at("def add(a, b):\n    ret\nprint()\n", 1, 7)
    assert ctx.prefix == "def add(a, b):\n    ret"
    assert ctx.suffix == "\nprint()\n"
    assert ctx.word == "ret"
    assert ctx.word_start == types.Position(line=1, character=4)
    assert ctx.version == 4


def test_surrogate_pairs_count_as_two_utf16_units() -> None:
    # "😀" is one code point but two UTF-16 code units: character 8 is after "s = '😀x".
    ctx = _at("s = '😀x'\n", 0, 8)
    assert ctx.prefix == "s = '😀x"
    assert ctx.suffix == "'\n"
    assert ctx.word == "x"
    assert ctx.word_start == types.Position(line=0, character=7)


def test_crlf_lines() -> None:
    ctx = _at("a = 1\r\nbb = 2\r\n", 1, 2)
    assert ctx.prefix == "a = 1\r\nbb"
    assert ctx.suffix == " = 2\r\n"


def test_character_past_the_end_of_the_line_is_clamped() -> None:
    ctx = _at("ab\ncd\n", 0, 99)
    assert ctx.prefix == "ab" and ctx.suffix == "\ncd\n"
    assert ctx.position == types.Position(line=0, character=2)


def test_position_after_the_final_newline_is_valid() -> None:
    ctx = _at("ab\n", 1, 0)
    assert ctx.prefix == "ab\n" and ctx.suffix == ""


def test_empty_document() -> None:
    ctx = _at("", 0, 0)
    assert ctx.prefix == "" and ctx.suffix == ""


@pytest.mark.parametrize(("line", "character"), [(5, 0), (2, 1)])
def test_lines_that_do_not_exist_are_an_error(line: int, character: int) -> None:
    with pytest.raises(PositionError):
        _at("ab\ncd", line, character)


def test_budget_keeps_three_quarters_prefix_one_quarter_suffix() -> None:
    text = "a" * 10_000 + "b" * 10_000
    ctx = build_context(_doc(text), types.Position(line=0, character=10_000), 100)  # 400 characters
    assert ctx.prefix == "a" * 300
    assert ctx.suffix == "b" * 100


def test_a_cut_prefix_starts_at_a_line_start() -> None:
    text = "x = 'a'\n" * 100 + "y = 1\n"
    ctx = build_context(_doc(text), types.Position(line=100, character=5), 10)  # 30 characters of prefix
    assert ctx.prefix.startswith("x = ") and ctx.prefix.endswith("y = 1")
    assert len(ctx.prefix) <= 30


def test_end_of_line_for_replacing_closers() -> None:
    from diffgemma_lsp.context import end_of_line

    ctx = _at("print(f(😀x))\n", 0, 11)  # after "x": the emoji is two UTF-16 units
    assert ctx.suffix.startswith("))")
    assert end_of_line(ctx) == types.Position(line=0, character=13)


@pytest.mark.parametrize(
    ("prefix", "scope"),
    [
        ("def f():\n    return x +", "line"),
        ("def f():\n    ", "block"),
        ("def f():", "block"),
        ("if (x) {", "block"),
        ("print(", "block"),
        ("x = compute(a, b)", "line"),
        ("", "block"),
    ],
)
def test_cursor_scope(prefix: str, scope: str) -> None:
    assert cursor_scope(prefix) == scope
