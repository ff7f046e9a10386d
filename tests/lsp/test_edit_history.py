"""Issue 29, its first part: the recent edits of each document as unified-diff hunks (``diffgemma_lsp.edit_history``),
fed by a real ``LineDocument``'s changes: one hunk per burst of typing at one place, nothing for typing taken back
or an undo, bounded, only closed hunks in the prompt."""

from __future__ import annotations

import functools

from lsprotocol import types

from diffgemma_lsp.document import LineDocument
from diffgemma_lsp.edit_history import BURST_GAP_S, MAX_HUNK_CHARS, MAX_HUNKS, EditHistory, render

URI = "file:///work/calc.py"
SOURCE = "def area(width, height):\n    return width * height\n\n\nprint(area(2, 3))\n"


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _document(history: EditHistory, source: str = SOURCE, uri: str = URI) -> LineDocument:
    document = LineDocument(uri, source, version=1)
    document.on_replace = functools.partial(history.replaced, uri)
    return document


def _type(document: LineDocument, line: int, start: int, end: int, text: str) -> None:
    change = types.TextDocumentContentChangePartial(
        range=types.Range(
            start=types.Position(line=line, character=start), end=types.Position(line=line, character=end)
        ),
        text=text,
    )
    document.apply_change(change)


def _recent(history: EditHistory, *documents: LineDocument, budget: int = 10_000) -> str:
    lines = {document.uri: document.lines for document in documents}
    return render(history.recent(lines.get, budget), lambda uri: uri.rsplit("/", 1)[-1])


def test_a_burst_of_typing_is_one_hunk_once_it_pauses() -> None:
    clock = Clock()
    history = EditHistory(clock)
    document = _document(history)
    for index, char in enumerate("size"):  # renaming the parameter, key by key (width -> size)
        _type(document, 0, 9 + index, 9 + index + (5 if index == 0 else 0), char)
        clock.now += 0.1
    assert _recent(history, document) == ""  # the burst being typed is in the code itself
    clock.now += BURST_GAP_S
    assert _recent(history, document) == (
        "--- a/calc.py\n+++ b/calc.py\n@@ -1,1 +1,1 @@\n-def area(width, height):\n+def area(size, height):\n"
    )


def test_an_edit_elsewhere_closes_the_burst_and_starts_another() -> None:
    clock = Clock()
    history = EditHistory(clock)
    document = _document(history)
    _type(document, 0, 4, 8, "surface")
    _type(document, 4, 6, 10, "surface")  # the call, three lines below: a second place
    assert _recent(history, document).count("@@ -") == 1  # the first is closed; the second still typed
    clock.now += BURST_GAP_S
    diff = _recent(history, document)
    assert diff.count("@@ -") == 2 and diff.index("+def surface(") < diff.index("+print(surface(2, 3))")


def test_typing_taken_back_and_an_undo_leave_nothing() -> None:
    clock = Clock()
    history = EditHistory(clock)
    document = _document(history)
    _type(document, 1, 11, 11, "abs(")
    _type(document, 1, 11, 15, "")  # deleted again in the same burst
    clock.now += BURST_GAP_S
    assert _recent(history, document) == ""
    _type(document, 1, 4, 10, "yield")
    clock.now += BURST_GAP_S
    assert "+    yield width * height" in _recent(history, document)
    _type(document, 1, 4, 9, "return")  # the editor's undo arrives as an ordinary change
    clock.now += BURST_GAP_S
    assert _recent(history, document) == ""


def test_lines_added_next_to_the_burst_join_it() -> None:
    clock = Clock()
    history = EditHistory(clock)
    document = _document(history)
    _type(document, 1, 29, 29, "\n")  # a new line after the return
    _type(document, 2, 0, 0, "    # in square units")
    clock.now += BURST_GAP_S
    assert _recent(history, document).endswith(
        "@@ -2,1 +2,2 @@\n-    return width * height\n+    return width * height\n+    # in square units\n"
    )


def test_history_is_bounded_and_the_newest_fit_the_budget_oldest_first() -> None:
    clock = Clock()
    history = EditHistory(clock)
    document = _document(history, "".join(f"x{index} = {index}\n" for index in range(40)))
    for index in range(MAX_HUNKS + 4):
        _type(document, 2 * index, 0, 1, "y")
        clock.now += BURST_GAP_S
    hunks = history.recent({URI: document.lines}.get, 10_000)
    assert len(hunks) == MAX_HUNKS and hunks[-1].start == 2 * (MAX_HUNKS + 3)
    two = history.recent({URI: document.lines}.get, len(hunks[-1].diff()) * 2)
    assert [hunk.start for hunk in two] == [2 * (MAX_HUNKS + 2), 2 * (MAX_HUNKS + 3)]


def test_a_large_paste_is_shown_by_its_start() -> None:
    clock = Clock()
    history = EditHistory(clock)
    document = _document(history)
    _type(document, 3, 0, 0, "".join(f"value_{index} = {index}\n" for index in range(500)))
    clock.now += BURST_GAP_S
    (hunk,) = history.recent({URI: document.lines}.get, 10_000)
    assert len(hunk.new) == 501 and len(hunk.diff()) <= MAX_HUNK_CHARS + 40
    assert hunk.diff().rstrip().endswith("more lines)")


def test_a_whole_document_change_reports_only_what_differs() -> None:
    clock = Clock()
    history = EditHistory(clock)
    document = _document(history)
    document.apply_change(types.TextDocumentContentChangeWholeDocument(text=SOURCE.replace("* height", "* height / 2")))
    clock.now += BURST_GAP_S
    assert _recent(history, document).endswith(
        "@@ -2,1 +2,1 @@\n-    return width * height\n+    return width * height / 2\n"
    )


def test_each_document_has_its_history_and_a_closed_one_has_none() -> None:
    clock = Clock()
    history = EditHistory(clock)
    first, second = _document(history), _document(history, uri="file:///work/other.py")
    _type(first, 0, 4, 8, "surface")
    clock.now += 0.1
    _type(second, 4, 0, 5, "log")
    clock.now += BURST_GAP_S
    both = _recent(history, first, second)
    assert both.index("--- a/calc.py") < both.index("--- a/other.py")  # in the order they were made
    history.forget(URI)
    assert "calc.py" not in _recent(history, first, second)


def test_the_completer_sends_the_edits_after_the_other_files_within_their_budget() -> None:
    from diffgemma_engine.shared.prompt import EDITS_CHUNK_NAME, chat_file_block
    from diffgemma_lsp.session import Session
    from diffgemma_lsp.settings import Settings

    clock = Clock()
    documents: dict[str, LineDocument] = {}
    session = Session(documents.get)
    session.history = EditHistory(clock)
    other = documents["file:///work/other.py"] = _document(session.history, "x = 1\n", "file:///work/other.py")
    session.extra.add(other.uri, other.source)
    document = documents[URI] = _document(session.history)
    _type(document, 0, 4, 8, "surface")
    clock.now += BURST_GAP_S
    chunks = session.extra_chunks(Settings(), URI, 0)
    assert [chunk.filename for chunk in chunks] == ["other.py", EDITS_CHUNK_NAME]
    assert "+def surface(width, height):" in chunks[-1].text
    chat = chat_file_block(chunks[-1].filename, chunks[-1].text, "python")  # the chat layout shows it as a diff
    assert chat.startswith("The user's recent edits:\n```diff\n--- a/calc.py\n")
    assert [chunk.filename for chunk in session.extra_chunks(Settings(edit_history_tokens=0), URI, 0)] == ["other.py"]


async def test_a_debounced_completion_with_no_backend_leaves_nothing_in_flight() -> None:
    """The debounce's marker said "a completion is in flight" for good when nothing was sent (no backend): next
    edits on a pause were then never computed for the document."""
    from diffgemma_lsp.features.completion import Completions
    from diffgemma_lsp.session import Session
    from diffgemma_lsp.settings import Settings

    documents: dict[str, LineDocument] = {}
    session = Session(documents.get)
    documents[URI] = _document(session.history)
    position = types.Position(line=0, character=4)
    assert await Completions(session).complete(Settings(debounce_ms=5), URI, position, automatic=True) == []
    assert session.inflight.kind(URI) is None


def test_a_document_is_edited_from_its_first_change_until_what_was_done_is_undone() -> None:
    """What ``diffgemma/nextEdit`` asks before it asks the model: nothing the user did calls for an edit otherwise."""
    clock = Clock()
    history = EditHistory(clock)
    document = _document(history)
    assert not history.edited(URI)
    _type(document, 0, 9, 14, "size")
    assert history.edited(URI)  # the burst being typed counts
    clock.now += BURST_GAP_S
    _recent(history, document)  # the burst closes into a hunk
    assert history.edited(URI)
    _type(document, 0, 9, 13, "width")  # the undo, as the editor sends it
    clock.now += BURST_GAP_S
    assert _recent(history, document) == "" and not history.edited(URI)
    history.forget(URI)
    assert not history.edited(URI)
