"""Issue 29: a next edit's window and its edits (``diffgemma_lsp.next_edit``): whole lines around the cursor, the
document's end in the client's units, and the answer diffed into whole-line edits that rebuild it."""

from __future__ import annotations

import pytest
from lsprotocol import types
from pygls.exceptions import JsonRpcInvalidParams
from pygls.workspace import TextDocument

from diffgemma_lsp.document import LineDocument
from diffgemma_lsp.features.next_edit import next_edit_request, suggested_window
from diffgemma_lsp.features.selection import edit_window, line_edits, read_selection
from diffgemma_lsp.params import parse_arguments
from diffgemma_lsp.settings import Settings

SOURCE = "".join(f"line {index}\n" for index in range(30))


def _applied(document: TextDocument, edits: list[types.TextEdit]) -> str:
    """The document after ``edits`` (given in its positions, applied last first)."""
    copy = LineDocument(document.uri, document.source, version=1)
    for edit in sorted(edits, key=lambda edit: (edit.range.start.line, edit.range.start.character), reverse=True):
        copy.apply_change(types.TextDocumentContentChangePartial(range=edit.range, text=edit.new_text))
    return copy.source


def test_the_window_is_whole_lines_around_the_cursor() -> None:
    document = LineDocument("file:///a.py", SOURCE, version=1)
    window = edit_window(document, 15, 10)
    assert (window.start, window.end) == (types.Position(line=5, character=0), types.Position(line=26, character=0))
    top = edit_window(document, 2, 10)
    assert (top.start.line, top.end.line) == (0, 13)
    assert edit_window(document, 29, 3).end == types.Position(line=30, character=0)  # the end, after the last break


def test_the_window_fits_the_models_canvas_keeping_the_cursors_line() -> None:
    """Before: the shipped model's canvas is 32 tokens, and 21 lines of code never fit it: the engine refused every
    next edit with it. The window loses the lines farthest from the cursor until it holds the characters a canvas
    can (``CHARS_PER_CANVAS_TOKEN`` each of its tokens)."""
    document = LineDocument("file:///a.py", SOURCE, version=1)  # 7 characters a line ("line 5\n"), 8 from 10 on
    fitted = edit_window(document, 15, 10, max_chars=40)
    assert (fitted.start.line, fitted.end.line) == (13, 18)  # 5 lines of 8: the cursor's, two above, two below
    top = edit_window(document, 0, 10, max_chars=30)
    assert (top.start.line, top.end.line) == (0, 4)  # all below the first line
    alone = edit_window(document, 15, 10, max_chars=1)
    assert (alone.start.line, alone.end.line) == (15, 16)  # never less than the cursor's line
    assert edit_window(document, 15, 10, max_chars=10_000) == edit_window(document, 15, 10)


def test_the_window_ends_at_the_documents_end_in_utf16_units() -> None:
    document = LineDocument("file:///a.py", "x = 1\ny = '😀😀'", version=1)
    window = edit_window(document, 0, 10)
    assert window.end == types.Position(line=1, character=10)  # 8 code points, each emoji two UTF-16 units
    selection = read_selection(document, window, 1024)
    assert selection.text == document.source


@pytest.mark.parametrize(
    "new_window",
    [
        "line 5\nline 6 changed\nline 7\n",  # one line replaced
        "line 5\nline 7\n",  # one deleted
        "line 5\nline 6\nline 6b\nline 7\n",  # one added
        "line 5 x\nline 6\nline 7 y\n",  # two apart
    ],
)
def test_the_edits_rebuild_the_answer_and_touch_only_changed_lines(new_window: str) -> None:
    document = LineDocument("file:///a.py", SOURCE, version=1)
    selection = read_selection(document, edit_window(document, 6, 1), 4096)
    assert selection.text == "line 5\nline 6\nline 7\n"
    edits = line_edits(selection, new_window)
    assert edits and all(edit.range.start.character == 0 and edit.range.end.character == 0 for edit in edits)
    assert _applied(document, edits) == SOURCE.replace("line 5\nline 6\nline 7\n", new_window)
    assert line_edits(selection, selection.text) == []


def test_an_edit_is_suggested_only_when_every_draw_writes_it() -> None:
    """The measured signal (benchmarks/next_edit_signals.py): a model's real next edit comes back from each of its
    draws, its noise does not. Draws that differ only in what post-processing removes still agree."""
    document = LineDocument("file:///a.py", SOURCE, version=1)
    window = read_selection(document, edit_window(document, 6, 1), 4096)
    edited = "line 5\nline 6 changed\nline 7\n"
    assert suggested_window(window, [edited], instruct=False) == edited  # one draw: what it writes
    assert suggested_window(window, [edited, edited.rstrip("\n") + "  \n"], instruct=False) == edited
    assert suggested_window(window, [edited, "line 5\nline 6 other\nline 7\n"], instruct=False) is None
    assert suggested_window(window, [edited, window.text], instruct=False) is None  # one draw keeps the window
    assert suggested_window(window, [window.text], instruct=False) is None  # no edit


@pytest.mark.parametrize("draws", [1, 2, 4])
def test_the_request_asks_for_the_draws_the_setting_wants(draws: int) -> None:
    document = LineDocument("file:///a.py", SOURCE, version=1)
    asked = next_edit_request(document, 6, Settings(next_edit_draws=draws), 0, [], "id")
    assert asked is not None
    assert asked[1].candidates == draws and asked[1].start and asked[1].strength == pytest.approx(0.3)


def test_an_edit_at_the_documents_end_without_a_line_break() -> None:
    document = LineDocument("file:///a.py", "a = 1\nb = a", version=1)
    selection = read_selection(document, edit_window(document, 1, 5), 4096)
    edits = line_edits(selection, "a = 1\nb = a + 1")
    assert _applied(document, edits) == "a = 1\nb = a + 1"


@pytest.mark.parametrize(
    ("params", "said"),
    [
        ({"position": {"line": 0, "character": 0}}, "textDocument.uri"),
        ({"textDocument": {"uri": "file:///a.py"}, "position": {"line": 0, "character": 0}}, "version"),
        ({"textDocument": {"uri": "file:///a.py", "version": 1}, "position": {"line": "0"}}, "position"),
    ],
)
def test_bad_params_are_named(params: dict[str, object], said: str) -> None:
    with pytest.raises(JsonRpcInvalidParams, match=said):
        parse_arguments(params)
