"""Documents kept as lists of lines: each edit against a splice of the whole text, line identity, LSP line breaks."""

from __future__ import annotations

import random

import pytest
from lsprotocol import types
from pygls.workspace import Workspace

from diffgemma_lsp.context import build_context
from diffgemma_lsp.document import LineDocument, LineWorkspace, split_lines

URI = "file:///t.py"
PIECES = [
    "",
    "a",
    "xyz",
    " ",
    "\n",
    "\r\n",
    "\r",
    "\r\r\n",
    "\n\r",
    "😀",
    "é",
    "\u2028",
    "\u2029",
    "\x0c",
    "\x85",
    "\x0b",
    "def f(x):\n    return x\n",
    "a😀\r\nb",
]


def _reference_split(text: str) -> list[str]:
    """The LSP's lines, one character at a time: breaks are "\\r\\n", "\\n" and "\\r", kept at the line's end."""
    lines, start, index = [], 0, 0
    while index < len(text):
        if text[index] == "\r" and text[index + 1 : index + 2] == "\n":
            index += 2
        elif text[index] in "\r\n":
            index += 1
        else:
            index += 1
            continue
        lines.append(text[start:index])
        start = index
    if start < len(text):
        lines.append(text[start:])
    return lines


def _offset(text: str, position: types.Position) -> int:
    """``position`` (UTF-16) as an index into ``text``: a character past its line's end is the end of the line (its
    break excluded), a line past the last is the end of the text; half a surrogate pair rounds up."""
    lines = _reference_split(text)
    if position.line >= len(lines):
        return len(text)
    content = lines[position.line].rstrip("\r\n")
    units = index = 0
    while index < len(content) and units < position.character:
        units += 2 if ord(content[index]) > 0xFFFF else 1
        index += 1
    return sum(len(line) for line in lines[: position.line]) + index


def _utf16(text: str) -> int:
    return len(text.encode("utf-16-le")) // 2


def _change(start: tuple[int, int], end: tuple[int, int], text: str) -> types.TextDocumentContentChangePartial:
    return types.TextDocumentContentChangePartial(
        range=types.Range(
            start=types.Position(line=start[0], character=start[1]),
            end=types.Position(line=end[0], character=end[1]),
        ),
        text=text,
    )


def _random_position(rng: random.Random, text: str) -> tuple[int, int]:
    lines = _reference_split(text)
    line = rng.randrange(len(lines) + 2)  # sometimes past the end of the document
    if line >= len(lines):
        return line, rng.choice([0, 0, 3])
    return line, rng.randrange(_utf16(lines[line].rstrip("\r\n")) + 3)  # sometimes past the end of the line


def test_random_edits_match_a_splice_of_the_whole_text() -> None:
    rng = random.Random(20261207)
    text = "import os\r\nx = '😀'\u2028y\n\n  z = 1\rw\n"
    document = LineDocument(URI, text, version=1)
    for step in range(4000):
        kind = rng.random()
        if kind < 0.1:  # at the very end of the document (after its last break, or on its last line)
            lines = _reference_split(text)
            start = end = (len(lines) + rng.choice([0, 1]), rng.choice([0, 5]))
        elif kind < 0.3 or len(text) > 2000:  # delete, often across lines
            start, end = sorted([_random_position(rng, text), _random_position(rng, text)])
        else:
            start = _random_position(rng, text)
            end = start if rng.random() < 0.5 else max(start, _random_position(rng, text))
        inserted = "" if kind < 0.3 else "".join(rng.choice(PIECES) for _ in range(rng.randint(1, 3)))
        cut_start = _offset(text, types.Position(line=start[0], character=start[1]))
        cut_end = _offset(text, types.Position(line=end[0], character=end[1]))
        text = text[:cut_start] + inserted + text[cut_end:]
        document.apply_change(_change(start, end, inserted))
        assert document.source == text, (step, start, end, inserted)
        assert list(document.lines) == split_lines(text) == _reference_split(text), (step, start, end, inserted)
        line = rng.randrange(len(document.lines) + 1)
        assert document.offset_at_line(line) == sum(map(len, document.lines[:line])), step


def test_untouched_lines_are_the_same_objects_after_an_edit() -> None:
    document = LineDocument(URI, "".join(f"value_{i} = {i}\n" for i in range(100_000)))
    before = list(document.lines)
    document.apply_change(_change((50_000, 6), (50_000, 7), "X"))
    after = document.lines
    assert len(after) == len(before) and after[50_000] == "value_X0000 = 50000\n"
    assert all(after[i] is before[i] for i in range(len(before)) if i != 50_000)
    document.apply_change(_change((10, 0), (10, 0), "new line\n"))  # the lines after line 10 move down, unchanged
    assert document.lines[10:12] == ["new line\n", "value_10 = 10\n"]
    assert all(document.lines[i + (i > 10)] is before[i] for i in range(len(before)) if i not in (10, 50_000))


@pytest.mark.parametrize("separator", ["\u2028", "\u2029", "\x0b", "\x0c", "\x1c", "\x1d", "\x1e", "\x85"])
def test_only_lsp_line_breaks_start_a_line(separator: str) -> None:
    text = f"a = '{separator}'\nb = 1\n"
    document = LineDocument(URI, text)
    assert list(document.lines) == [f"a = '{separator}'\n", "b = 1\n"]
    document.apply_change(_change((1, 4), (1, 5), "2"))  # the editor's line 1: "b = 1"
    assert document.source == f"a = '{separator}'\nb = 2\n"
    context = build_context(document, types.Position(line=0, character=7), 1000)
    assert context.prefix == f"a = '{separator}'" and context.suffix == "\nb = 2\n"


def test_a_cr_left_before_a_lf_makes_one_line_break() -> None:
    document = LineDocument(URI, "a\rb\nc")
    document.apply_change(_change((1, 0), (1, 1), ""))  # delete "b": "a\r" meets "\n"
    assert list(document.lines) == ["a\r\n", "c"]
    document = LineDocument(URI, "a\r")
    document.apply_change(_change((1, 0), (1, 0), "\n"))  # typed at the end, after the "\r"
    assert list(document.lines) == ["a\r\n"]
    document.apply_change(_change((0, 1), (0, 1), "\r"))  # before a "\r\n": a lone "\r", then "\r\n"
    assert list(document.lines) == ["a\r", "\r\n"]


def test_positions_past_a_line_or_the_document_are_clamped() -> None:
    document = LineDocument(URI, "ab\r\ncd")
    document.apply_change(_change((0, 3), (0, 9), "X"))  # never between the "\r" and the "\n"
    assert document.source == "abX\r\ncd"
    document.apply_change(_change((7, 0), (9, 2), "!"))  # past the last line: the end of the document
    assert document.source == "abX\r\ncd!"
    document.apply_change(_change((1, 1), (5, 0), ""))
    assert document.source == "abX\r\nc"


def test_utf16_columns_count_surrogate_pairs_as_two() -> None:
    document = LineDocument(URI, "s = '😀x'\n")
    document.apply_change(_change((0, 7), (0, 8), "y"))  # "x" is at UTF-16 column 7 (code point 6)
    assert document.source == "s = '😀y'\n"


def test_empty_document_and_deleting_everything() -> None:
    document = LineDocument(URI, "")
    assert list(document.lines) == [] and document.source == ""
    document.apply_change(_change((0, 0), (0, 0), "x = 1\n"))
    assert list(document.lines) == ["x = 1\n"]
    document.apply_change(_change((0, 0), (1, 0), ""))
    assert list(document.lines) == [] and document.source == "" and document.offset_at_line(3) == 0


def test_full_changes_and_none_sync() -> None:
    document = LineDocument(URI, "a\nb\n")
    assert document.offset_at_line(2) == 4
    document.apply_change(types.TextDocumentContentChangeWholeDocument(text="x\u2028\r\nyy\n"))
    assert list(document.lines) == ["x\u2028\r\n", "yy\n"] and document.offset_at_line(2) == 7
    document.apply_change(_change((1, 1), (1, 1), "z"))
    assert document.source == "x\u2028\r\nyzy\n"
    full = LineDocument(URI, "a\n", sync_kind=types.TextDocumentSyncKind.Full)
    full.apply_change(_change((0, 0), (0, 1), "whole text\n"))  # as pygls: a range is ignored, the text taken
    assert list(full.lines) == ["whole text\n"]
    none = LineDocument(URI, "a\n", sync_kind=types.TextDocumentSyncKind.None_)
    none.apply_change(types.TextDocumentContentChangeWholeDocument(text="b\n"))
    assert none.source == "a\n"


def test_a_document_not_opened_is_read_from_disk(tmp_path) -> None:
    path = tmp_path / "on_disk.py"
    path.write_text("a = 1\u2028\nb = 2\n")
    document = LineDocument(path.as_uri())
    assert list(document.lines) == ["a = 1\u2028\n", "b = 2\n"] and document.offset_at_line(1) == 7


def test_context_is_the_same_as_on_pygls_documents() -> None:
    from pygls.workspace import TextDocument

    rng = random.Random(7)
    text = "".join(
        rng.choice(["def f(a):\n", "    return a  # é😀\r\n", "\n", "x = [1,\r", "  2]\n"]) for _ in range(400)
    )
    line_document, pygls_document = LineDocument(URI, text, version=3), TextDocument(URI, text, version=3)
    for _ in range(200):
        line = rng.randrange(len(pygls_document.lines))
        position = types.Position(line=line, character=rng.randrange(30))
        assert build_context(line_document, position, 64) == build_context(pygls_document, position, 64)


def test_workspace_makes_line_documents_and_keeps_its_settings() -> None:
    plain = Workspace("file:///root", types.TextDocumentSyncKind.Incremental, [], types.PositionEncodingKind.Utf8)
    plain.put_text_document(types.TextDocumentItem(uri=URI, language_id="python", version=2, text="é = 1\n"))
    workspace = LineWorkspace.like(plain)
    assert workspace.root_uri == "file:///root" and workspace.position_encoding == types.PositionEncodingKind.Utf8
    kept = workspace.get_text_document(URI)
    assert isinstance(kept, LineDocument) and kept.version == 2 and kept.source == "é = 1\n"
    workspace.put_text_document(types.TextDocumentItem(uri="file:///u.py", language_id="python", version=1, text=""))
    opened = workspace.get_text_document("file:///u.py")
    assert isinstance(opened, LineDocument)
    workspace.update_text_document(
        types.VersionedTextDocumentIdentifier(uri=URI, version=3), _change((0, 2), (0, 2), "x")
    )  # UTF-8 columns: "é" is two units
    assert kept.source == "éx = 1\n" and kept.version == 3
