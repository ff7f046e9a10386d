"""When typing into a shown suggestion is a divergence to refine (``diffgemma_lsp.refine``), and what is sent."""

from __future__ import annotations

import pytest

from diffgemma_engine.shared import protocol
from diffgemma_lsp.refine import Divergence, diverged, refine_request, refined
from diffgemma_lsp.reuse import Shown, ShownCompletions

BEFORE = "def add(a, b):\n"
AFTER = "\n\nprint(add(1, 2))\n"
SHOWN = "    total = a - b\n    return total"
OFFSET = len(BEFORE)


def shown() -> Shown:
    completions = ShownCompletions()
    completions.remember("u", BEFORE + AFTER, OFFSET, SHOWN)
    last = completions.last("u")
    assert last is not None
    return last


def typed(text: str, before: str = BEFORE, after: str = AFTER) -> Divergence | None:
    source = before + text + after
    return diverged(shown(), source, len(before) + len(text))


def test_a_keystroke_the_suggestion_does_not_start_with_diverges() -> None:
    assert typed("    total = a +") == Divergence(offset=OFFSET, typed="    total = a +", seed=" b\n    return total")
    assert typed("    x") == Divergence(offset=OFFSET, typed="    x", seed="otal = a - b\n    return total")


@pytest.mark.parametrize("text", ["", "    tot", SHOWN[:-1]])
def test_typing_what_was_shown_is_no_divergence(text: str) -> None:
    assert typed(text) is None  # nothing typed, or the shown text still applies (reuse.py)


def test_typing_over_all_of_it_or_editing_elsewhere_is_none() -> None:
    assert typed("    total = a + b\n    return total!") is None  # nothing of the suggestion left
    assert typed("    q", before="# x\n" + BEFORE) is None  # the text before it moved
    assert typed("    q", after=AFTER.replace("print", "show")) is None  # the text after it changed
    source = BEFORE + "    q" + AFTER
    assert diverged(shown(), source, OFFSET) is None  # the cursor went back


def test_the_refine_request_starts_where_the_suggestion_was_offered() -> None:
    found = typed("    total = a +")
    assert found is not None
    insertion = protocol.Infill(
        id="", uri="u", prefix=BEFORE + found.typed, suffix=AFTER, deadline_ms=300, candidates=1, max_steps=16
    )
    request = refine_request(insertion, found, 4)
    assert (request.prefix, request.suffix, request.deadline_ms) == (BEFORE, AFTER, 300)
    assert request.scope is protocol.Scope.BLOCK  # the cursor's scope where the suggestion was offered
    assert request.start == [
        protocol.StartSegment(text="    total = a +", keep=True),
        protocol.StartSegment(text=" b\n    return total"),
    ]
    assert (request.strength, request.max_steps) == (0.5, 8)
    with pytest.raises(ValueError, match="must end with the typed text"):
        refine_request(protocol.Infill(id="", uri="u", prefix=BEFORE), found, 4)


def test_the_answer_is_what_follows_the_typed_text() -> None:
    found = Divergence(offset=0, typed="ab", seed="x")
    assert refined(found, "abcd") == "cd"
    assert refined(found, "ab") is None
    assert refined(found, "a") is None
    assert refined(found, "xbcd") is None
