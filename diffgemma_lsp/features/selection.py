"""What a rewrite and a next edit share: a span of the document read with the text around it (``Selection``; a next
edit's is a window of whole lines, ``edit_window``, as much as a canvas holds: ``fits``), the rewrite request that
starts the canvas from it, the check that the document still holds the text it was read from, the edits that replace
it, and how their arguments are read (an InvalidParams error that says what is wrong)."""

from __future__ import annotations

import difflib
import logging
from collections.abc import Sequence

import attrs
from lsprotocol import types
from pygls.workspace import TextDocument

from diffgemma_engine.shared import protocol
from diffgemma_lsp.context import PositionError, build_context
from diffgemma_lsp.document import split_lines
from diffgemma_lsp.params import invalid_params
from diffgemma_lsp.settings import Settings

logger = logging.getLogger(__name__)


@attrs.frozen(kw_only=True)
class Selection:
    """The selected text and the text around it, cut to the prompt budget."""

    uri: str
    range: types.Range
    """Clamped to the document (in the client's units)."""
    version: int
    text: str
    prefix: str
    """The text before the selection, cut to three quarters of the budget (as for a completion)."""
    suffix: str
    """The text after the selection, cut to a quarter of the budget."""
    language_id: str
    source: str = attrs.field(repr=False)
    """The document's whole text the selection was read from: the edit is for this text only."""


def computed_on(selection: Selection, document: TextDocument | None) -> bool:
    """Whether ``document`` holds the very text ``selection`` was read from, at its version (``holds``)."""
    return holds(document, selection.version, selection.source)


def holds(document: TextDocument | None, version: int, source: str) -> bool:
    """Whether ``document`` is at ``version`` and its text is ``source``. The version alone does not say so: a
    document opened again (closed and reopened, or a second ``didOpen``) starts its versions anew, and an edit for
    "version 1" would land on other text."""
    if document is None or (document.version or 0) != version:
        return False
    return document.source == source  # the same string object while unchanged: no comparison then


def read_selection(document: TextDocument, selected: types.Range, context_tokens: int, method: str = "") -> Selection:
    """The selection and the text around it; an InvalidParams error (of ``method``) for a selection that is empty,
    reversed or not in the document (a character past its line's end counts as the line's end, as LSP says)."""
    try:
        before = build_context(document, selected.start, context_tokens)
        after = build_context(document, selected.end, context_tokens)
    except PositionError as exc:
        raise invalid_params(method, f"the selection is not in the document: {exc}") from None
    if after.offset < before.offset:
        raise invalid_params(method, "the selection ends before it starts")
    if after.offset == before.offset:
        raise invalid_params(method, "the selection is empty: select the code to rewrite")
    return Selection(
        uri=document.uri,
        range=types.Range(start=before.position, end=after.position),
        version=document.version or 0,
        text=document.source[before.offset : after.offset],
        prefix=before.prefix,
        suffix=after.suffix,
        language_id=document.language_id or "",
        source=document.source,
    )


def build_request(
    selection: Selection,
    settings: Settings,
    instruction: str,
    extra: Sequence[protocol.Chunk],
    request_id: str,
    strength: float | None = None,
) -> protocol.Infill:
    """The infill that rewrites ``selection``: its canvas starts from the selected text, ``strength`` of it renoised
    (default: ``rewriteStrength``), with no deadline (the user waits for it, and can cancel)."""
    return protocol.Infill(
        id=request_id,
        uri=selection.uri,
        prefix=selection.prefix,
        suffix=selection.suffix,
        language_id=selection.language_id,
        extra=list(extra),
        doc_version=selection.version,
        canvas_length=settings.canvas_length,
        max_steps=settings.rewrite_steps,
        start=[protocol.StartSegment(text=selection.text)],
        strength=settings.rewrite_strength if strength is None else strength,
        instruction=instruction,
    )


CHARS_PER_CANVAS_TOKEN = 2.5
"""Characters a window may hold per token of the model's canvas: fewer than code averages (about 3.5), so that a
window of dense code still fits with its end-of-sequence token (the engine refuses one that does not)."""


def canvas_chars(canvas_tokens: int) -> int | None:
    """The most characters a window may hold for a canvas of ``canvas_tokens`` (0: not known, None: no limit)."""
    return int(canvas_tokens * CHARS_PER_CANVAS_TOKEN) if canvas_tokens else None


def fits(window: Selection, canvas_tokens: int) -> bool:
    """Whether ``window`` fits a canvas of ``canvas_tokens`` (``canvas_chars``); logged when it does not (a next
    edit's chain leaves such a place out, where the engine would refuse the whole request)."""
    limit = canvas_chars(canvas_tokens)
    if limit is None or len(window.text) <= limit:
        return True
    logger.info("%s: line %d is longer than a canvas: left out", window.uri, window.range.start.line + 1)
    return False


def edit_window(document: TextDocument, line: int, lines_each_way: int, max_chars: int | None = None) -> types.Range:
    """Whole lines around ``line``: ``lines_each_way`` above and below it, within the document (the end is the
    start of the line after the window, or the document's end), then, while the window holds more than
    ``max_chars`` characters, less the line farthest from ``line`` (``line`` itself stays)."""
    lines = document.lines
    last = max(0, len(lines) - 1)
    line = min(line, last)
    first, end = max(0, line - lines_each_way), min(last, line + lines_each_way) + 1
    if max_chars is not None:
        size = sum(len(text) for text in lines[first:end])
        while size > max_chars and end - first > 1:
            if line - first > end - 1 - line:
                size -= len(lines[first])
                first += 1
            else:
                end -= 1
                size -= len(lines[end])
    if end < len(lines):
        return types.Range(start=types.Position(line=first, character=0), end=types.Position(line=end, character=0))
    # the window reaches the document's end: end at its last character (in the client's units)
    tail = lines[-1] if lines else ""
    ends_with_break = tail.endswith(("\n", "\r"))
    end_position = (
        types.Position(line=len(lines), character=0)
        if ends_with_break
        else types.Position(line=last, character=document.position_codec.client_num_units(tail))
    )
    return types.Range(start=types.Position(line=first, character=0), end=end_position)


def line_edits(window: Selection, new_text: str) -> list[types.TextEdit]:
    """The window's old lines against ``new_text``'s, as whole-line ``TextEdit``s in the document's positions (the
    smallest set ``difflib`` finds); none when nothing changed."""
    old, new = split_lines(window.text), split_lines(new_text)
    first = window.range.start.line

    def position(index: int) -> types.Position:
        if index >= len(old):
            return window.range.end  # the window's end: past its last line
        return types.Position(line=first + index, character=0)

    edits = []
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(a=old, b=new, autojunk=False).get_opcodes():
        if tag != "equal":
            edits.append(
                types.TextEdit(range=types.Range(start=position(i1), end=position(i2)), new_text="".join(new[j1:j2]))
            )
    return edits


def applied(lines: Sequence[str], window: types.Range, text: str) -> str:
    """The document of ``lines`` with its window of whole lines (``edit_window``'s) replaced by ``text``."""
    after = lines[window.end.line :] if window.end.character == 0 else []
    return "".join([*lines[: window.start.line], text, *after])


def versioned_edit(uri: str, version: int, edits: list[types.TextEdit], versioned: bool) -> types.WorkspaceEdit:
    """``edits`` of the document ``uri`` as one workspace edit: a ``TextDocumentEdit`` for its ``version`` (the
    client refuses it for another) where the client takes versioned edits (``documentChanges``), else plain
    changes."""
    if not versioned:
        return types.WorkspaceEdit(changes={uri: edits})
    document = types.OptionalVersionedTextDocumentIdentifier(uri=uri, version=version)
    return types.WorkspaceEdit(document_changes=[types.TextDocumentEdit(text_document=document, edits=edits)])
