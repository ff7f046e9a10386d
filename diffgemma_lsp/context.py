"""The text around the cursor, cut to a budget. Positions are converted by pygls (UTF-16 aware)."""

from __future__ import annotations

import re
from collections.abc import Sequence

import attrs
from lsprotocol import types
from pygls.workspace import TextDocument

from diffgemma_engine.shared.budget import CHARS_PER_LINE, block_lines
from diffgemma_lsp.document import LineDocument

CHARS_PER_TOKEN = 4
"""A generous estimate for code; the engine cuts to the exact token budget."""
_WORD_BEFORE = re.compile(r"[A-Za-z0-9_]*\Z")


class PositionError(ValueError):
    """A position that does not exist in the document."""


@attrs.frozen(kw_only=True)
class InfillContext:
    """What the model sees, and where the answer goes."""

    prefix: str
    suffix: str
    position: types.Position
    """The cursor, in the client's units: where the prefix ends, so never inside a character (a position inside
    one, such as between an emoji's two UTF-16 units, is taken to the character's end)."""
    word_start: types.Position
    """Start of the identifier the cursor is in (== position when there is none)."""
    word: str
    """The identifier characters between ``word_start`` and the cursor."""
    offset: int
    """The cursor as an index (code points) into the document's text."""
    version: int | None
    replace_end: types.Position | None = None
    """Where the edit ends when it replaces the closing characters after the cursor (else: the cursor)."""


def _utf16_length(text: str) -> int:
    return len(text.encode("utf-16-le", "surrogatepass")) // 2  # a lone surrogate (JSON allows one) is one unit


def clamp_position(
    document: TextDocument, position: types.Position, lines: Sequence[str] | None = None
) -> types.Position:
    """The position with its character clamped to the line (as LSP says), or ``PositionError``."""
    lines = document.lines if lines is None else lines
    if position.line < 0 or position.character < 0:
        raise PositionError(f"position {position.line}:{position.character} is negative")
    if position.line >= len(lines):
        at_end = position.line == len(lines) and (not lines or lines[-1].endswith(("\n", "\r")))
        if at_end or (not lines and position.line == 0):
            return types.Position(line=position.line, character=0)
        raise PositionError(f"line {position.line} is past the end of {document.uri} ({len(lines)} lines)")
    line_text = lines[position.line].rstrip("\r\n")
    return types.Position(line=position.line, character=min(position.character, _utf16_length(line_text)))


def build_context(document: TextDocument, position: types.Position, context_tokens: int) -> InfillContext:
    """Prefix and suffix around ``position`` within about ``context_tokens`` tokens (3/4 prefix, 1/4 suffix)."""
    lines = document.lines  # pygls' TextDocument splits the text anew on every access: once per request is enough
    position = clamp_position(document, position, lines)
    source = document.source  # a LineDocument joins it once per change; the server reads it for reuse anyway
    server = document.position_codec.position_from_client_units(lines, position)
    if position.line < len(lines):  # inside a surrogate pair (UTF-16) or a character's bytes (UTF-8): after it
        position = document.position_codec.position_to_client_units(lines, server)
    # (a position after the final line break stays: pygls reads it as the last line's end, past its line break)
    offset = server.character + _line_start(document, lines, server.line)
    budget = max(context_tokens, 1) * CHARS_PER_TOKEN
    suffix_budget = budget // 4
    block = block_lines(budget, CHARS_PER_LINE)
    start = _prefix_start(lines, server.line, server.character, offset, budget - suffix_budget, block)
    prefix = source[start:offset]
    suffix = source[offset : _suffix_end(lines, server.line, server.character, offset, suffix_budget)]
    word = _WORD_BEFORE.search(prefix)
    word_text = word.group(0) if word else ""
    word_start = types.Position(line=position.line, character=position.character - _utf16_length(word_text))
    return InfillContext(
        prefix=prefix,
        suffix=suffix,
        position=position,
        word_start=word_start,
        word=word_text,
        offset=offset,
        version=document.version,
    )


def _line_start(document: TextDocument, lines: Sequence[str], line: int) -> int:
    """The offset of ``line``'s start: kept by a LineDocument between keystrokes, else the sum of the lines before."""
    if isinstance(document, LineDocument):
        return document.offset_at_line(line)
    return sum(map(len, lines[:line]))


def _prefix_start(lines: Sequence[str], line: int, column: int, offset: int, budget: int, block: int) -> int:
    """Where the prefix starts: at a line whose number is a multiple of ``block``, the first such line within
    ``budget`` characters of the cursor, so that the start stays put while the user types (the engine reuses the
    prompt's encoding up to the first change) and moves a block at a time. A block that does not fit whole falls
    back to the first whole line that fits, then to a cut inside the cursor's line."""
    start = column  # characters from the start of line ``first`` to the cursor
    first = line
    while first > 0 and start + len(lines[first - 1]) <= budget:
        first -= 1
        start += len(lines[first])
    line_start = offset - start
    aligned = -(-first // block) * block
    if first == 0 or aligned > line:
        return line_start if start <= budget else offset - budget
    return line_start + sum(map(len, lines[first:aligned]))


def _suffix_end(lines: Sequence[str], line: int, column: int, offset: int, budget: int) -> int:
    """Where the suffix ends: after the whole lines that fit in ``budget`` (else inside the cursor's line). Typing
    before the suffix changes neither its text nor this end, so no blocks are needed here."""
    end = offset - column + len(lines[line]) if line < len(lines) else offset  # the end of the cursor's line
    if end - offset > budget:
        return offset + budget
    for index in range(line + 1, len(lines)):  # not ``lines[line + 1 :]``: that copies the rest of the document
        if end + len(lines[index]) - offset > budget:
            break
        end += len(lines[index])
    return end


def position_after(context: InfillContext, text: str) -> types.Position:
    """Where ``text`` ends when it starts at the cursor and holds no line break (the part of the suffix an edit
    replaces, ``Edit.replaced``), in the client's units."""
    return types.Position(line=context.position.line, character=context.position.character + _utf16_length(text))
