"""Completion text to LSP items."""

from __future__ import annotations

import attrs
from lsprotocol import types

from diffgemma_lsp.context import InfillContext
from diffgemma_lsp.postprocess.confidence import Scored
from diffgemma_lsp.results import completion_item, converter, escape_snippet, inline_item, label_for

CONTEXT = InfillContext(
    prefix="def hel",
    suffix="",
    position=types.Position(line=3, character=7),
    word_start=types.Position(line=3, character=4),
    word="hel",
    offset=7,
    version=1,
)


def test_escape_snippet_makes_text_literal() -> None:
    assert escape_snippet("${1:x} \\ $y }") == "\\${1:x\\} \\\\ \\$y \\}"


def test_multi_line_item_is_a_snippet_when_the_client_supports_it() -> None:
    item = completion_item(CONTEXT, 'lo(name):\n    return f"${name}"', snippets=True)
    assert item.insert_text_format is types.InsertTextFormat.Snippet
    assert isinstance(item.text_edit, types.TextEdit)
    assert item.text_edit.new_text == 'hello(name):\n    return f"\\${name\\}"'
    assert item.text_edit.range == types.Range(start=CONTEXT.word_start, end=CONTEXT.position)
    assert item.label == "hello(name):"
    assert item.filter_text == "hello(name):"


def test_plain_text_without_snippet_support() -> None:
    item = completion_item(CONTEXT, "lo():\n    pass", snippets=False)
    assert item.insert_text_format is types.InsertTextFormat.PlainText
    assert item.text_edit.new_text == "hello():\n    pass"


def test_single_line_item_is_a_snippet_too() -> None:
    """Before, a single-line item went as a plain-text edit, which Neovim 0.11 inserts as its first word
    (``newText:match('^(%S*)')``): "hello() or ${x}" became "hello()", and one starting with a space nothing."""
    item = completion_item(CONTEXT, "lo() or ${x}", snippets=True)
    assert item.insert_text_format is types.InsertTextFormat.Snippet
    assert item.text_edit.new_text == "hello() or \\${x\\}"
    starts_with_a_space = completion_item(attrs.evolve(CONTEXT, word="", word_start=CONTEXT.position), " + b", True)
    assert starts_with_a_space.text_edit.new_text == " + b"
    assert starts_with_a_space.insert_text_format is types.InsertTextFormat.Snippet


def test_only_an_invoked_item_is_preselected() -> None:
    """A menu that opens as the user types (a trigger character) must not hold a selected item that their next
    key would commit."""
    assert not completion_item(CONTEXT, "lo()", snippets=True).preselect
    assert completion_item(CONTEXT, "lo()", snippets=True, invoked=True).preselect


def test_inline_item_is_inserted_at_the_cursor() -> None:
    item = inline_item(CONTEXT, Scored("lo():\n    pass"))
    assert item.insert_text == "lo():\n    pass"
    assert item.range == types.Range(start=CONTEXT.position, end=CONTEXT.position)


def test_inline_items_carry_their_characters_confidence_on_the_wire() -> None:
    """``data.confidence``: runs of characters at one confidence (two decimals), as the server sends them; an item
    whose confidence is not known sends no ``data``, and the LSP fields are as before."""
    scored = Scored("lo(x)", (0.991, 0.99, 0.5, 0.123, 0.12))
    wire = converter().unstructure(types.InlineCompletionList(items=[inline_item(CONTEXT, scored)]))
    position = {"line": 3, "character": 7}
    assert wire == {
        "items": [
            {
                "insertText": "lo(x)",
                "range": {"start": position, "end": position},
                "data": {"confidence": [[2, 0.99], [1, 0.5], [2, 0.12]]},
            }
        ]
    }
    unknown = converter().unstructure(types.InlineCompletionList(items=[inline_item(CONTEXT, Scored("lo"))]))
    assert unknown == {"items": [{"insertText": "lo", "range": {"start": position, "end": position}}]}


def test_label_is_the_first_non_empty_line_shortened() -> None:
    assert label_for("\n\n  x = 1\ny") == "x = 1"
    assert len(label_for("z" * 500)) == 60


def test_replacing_the_closers_after_the_cursor() -> None:
    context = attrs.evolve(CONTEXT, replace_end=types.Position(line=3, character=9))
    assert inline_item(context, Scored("lo())")).range.end == types.Position(line=3, character=9)
    assert completion_item(context, "lo())", snippets=True).text_edit.range.end.character == 9
