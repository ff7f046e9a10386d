"""Context around the cursor: UTF-16 positions, CRLF, clamping, out-of-range lines."""

from __future__ import annotations

import pytest
from lsprotocol import types
from pygls.workspace import TextDocument

from diffgemma_lsp.context import PositionError, build_context


def _doc(text: str) -> TextDocument:
    return TextDocument("file:///t.py", text, version=4)


def _at(text: str, line: int, character: int, budget: int = 1000):
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


def test_a_cursor_between_the_units_of_a_surrogate_pair_is_after_the_character() -> None:
    """The prefix is read up to the end of the emoji, and the position says so (issue 31): an edit at the client's
    position would go between the emoji's two units and leave a lone surrogate."""
    ctx = _at("s = '😀x'\n", 0, 6)  # "s = '" is 5 units, the emoji 2 more
    assert (ctx.prefix, ctx.suffix) == ("s = '😀", "x'\n")
    assert ctx.position == ctx.word_start == types.Position(line=0, character=7)


def test_a_lone_surrogate_counts_as_one_utf16_unit() -> None:
    # JSON lets a client send "\ud800" alone; it is one UTF-16 code unit, not an error.
    ctx = _at("s = '\ud800x'\n", 0, 99)
    assert ctx.prefix == "s = '\ud800x'"
    assert ctx.position == types.Position(line=0, character=8)


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
    # and it stays where it is: (0, 3), past the end of "ab", is no position of the client's (VS Code reads it as
    # (0, 2), so a whole-line edit of a document's last line ending there kept the old line break, issue 45)
    assert ctx.position == types.Position(line=1, character=0)


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
    from diffgemma_lsp.context import position_after
    from diffgemma_lsp.postprocess import Edit

    ctx = _at("print(f(😀x))\n", 0, 11)  # after "x": the emoji is two UTF-16 units
    assert ctx.suffix.startswith("))")
    replaced = Edit(text="y))", replace_to_eol=True).replaced(ctx.suffix)
    assert position_after(ctx, replaced) == types.Position(line=0, character=13)


def test_the_prefix_start_stays_put_while_the_user_types_and_moves_by_blocks() -> None:
    """The engine reuses a prompt's encoding up to its first change: the cut must not slide with the cursor."""
    body = "".join(f"value_{i:03d} = {i}\n" for i in range(300))  # 16 characters a line
    starts = []
    for typed in range(400):
        text = body + "x" * typed
        ctx = _at(text, 300, typed, budget=200)
        assert len(ctx.prefix) <= 600 and ctx.prefix.endswith("x" * typed)
        starts.append(text.index(ctx.prefix))
    # It moves once per block's worth of typing (two 16-character lines), not with every keystroke.
    assert len(set(starts)) <= 400 // 32 + 2
    assert all((b - a) % 32 == 0 for a, b in zip(sorted(set(starts)), sorted(set(starts))[1:], strict=False))
    lines_at = {body.count("\n", 0, start) for start in starts if start < len(body)}
    assert all(line % 2 == 0 for line in lines_at)  # 200 tokens = 800 characters: blocks of 800 / (40 * 8) = 2 lines
    assert all(body[start - 1] == "\n" for start in starts if 0 < start < len(body))


def test_the_suffix_ends_after_whole_lines() -> None:
    text = "def f():\n    ├┤pass\n" + "".join(f"line_{i:04d}\n" for i in range(100))
    prefix, suffix = text.split("├┤")
    ctx = _at(prefix + suffix, 1, 4, budget=40)  # 160 characters: 40 of suffix
    assert ctx.suffix.startswith("pass\n") and ctx.suffix.endswith("\n") and len(ctx.suffix) <= 40
    assert suffix.startswith(ctx.suffix)
