"""Forward-typing reuse of a shown completion."""

from __future__ import annotations

from diffgemma_lsp.postprocess.confidence import Scored
from diffgemma_lsp.reuse import ShownCompletions

SOURCE = "def add(a, b):\n\n\nprint(add(1, 2))\n"
CURSOR = SOURCE.index("\n\n") + 1
TEXT = "    total = a + b\n    return total"


def _typed(n: int) -> tuple[str, int]:
    return SOURCE[:CURSOR] + TEXT[:n] + SOURCE[CURSOR:], CURSOR + n


def test_typing_the_suggestion_keeps_the_rest() -> None:
    shown = ShownCompletions()
    shown.remember("u", SOURCE, CURSOR, TEXT)
    for n in (1, 4, 10, len(TEXT) - 1):
        source, offset = _typed(n)
        assert shown.lookup("u", source, offset) == Scored(TEXT[n:])
    assert shown.hits == 4


def test_the_rest_keeps_the_confidence_it_was_shown_with() -> None:
    """Partial accept: the rest is shown again with the confidences of its own characters (the unsure tail stays
    dim in an editor that draws them)."""
    shown = ShownCompletions()
    confidence = tuple(0.9 if i < 10 else 0.2 for i in range(len(TEXT)))
    shown.remember("u", SOURCE, CURSOR, TEXT, confidence)
    assert shown.lookup("u", *_typed(4)) == Scored(TEXT[4:], confidence[4:])


def test_typing_something_else_misses() -> None:
    shown = ShownCompletions()
    shown.remember("u", SOURCE, CURSOR, TEXT)
    source = SOURCE[:CURSOR] + "    x" + SOURCE[CURSOR:]
    assert shown.lookup("u", source, CURSOR + 5) is None


def test_finished_suggestion_moved_cursor_or_other_edits_miss() -> None:
    shown = ShownCompletions()
    shown.remember("u", SOURCE, CURSOR, TEXT)
    assert shown.lookup("u", *_typed(len(TEXT))) is None  # all of it typed: nothing left to offer
    assert shown.lookup("u", SOURCE, CURSOR) is None  # nothing typed
    source, offset = _typed(3)
    assert shown.lookup("u", source.replace("print", "show"), offset) is None  # the text after changed
    assert shown.lookup("u", "# x\n" + source, offset + 4) is None  # the text before moved
    assert shown.lookup("other", source, offset) is None
    shown.forget("u")
    assert shown.lookup("u", source, offset) is None


def test_a_completion_is_showing_until_the_text_around_it_changes() -> None:
    shown = ShownCompletions()
    source = "def f(x):\n    return \n"
    offset = source.index("return ") + len("return ")
    assert not shown.showing("a.py", source)
    shown.remember("a.py", source, offset, "x + 1")
    assert shown.showing("a.py", source)
    assert not shown.showing("a.py", source[:offset] + "x" + source[offset:])  # typed (or taken): not as shown
    assert not shown.showing("a.py", "# new\n" + source)  # text above changed
    assert not shown.showing("b.py", source)
