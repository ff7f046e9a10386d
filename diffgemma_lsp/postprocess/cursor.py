"""The document around the cursor as the filters see it, computed once per request, and step 1 of the pipeline.

:class:`Cursor` holds the cursor's line split at the cursor, the lines around it, the brackets still open and
the indentation style; :func:`normalise` turns CRLF and CR into LF (step 1). Also the small line tests more than
one filter uses.
"""

from __future__ import annotations

import attrs

from diffgemma_lsp.postprocess.languages import (
    Language,
    State,
    Token,
    columns,
    indent_style,
    language_for,
    pair_tokens,
)
from diffgemma_lsp.postprocess.syntax import scan_document

CLOSING_CHARS = frozenset(")]}'\"`;,")
"""What the rest of the line may hold for a completion to replace it (plus spaces and tabs)."""


@attrs.frozen(kw_only=True)
class Cursor:
    """The document around the cursor, LF-normalised, as the filters see it."""

    language: Language
    before: tuple[str, ...]
    """The prefix's lines; the last is the cursor's line up to the cursor."""
    rest: str
    """The cursor's line after the cursor."""
    after: tuple[str, ...]
    """The suffix's lines after the cursor's line."""
    stack: tuple[Token, ...]
    """Brackets and block keywords opened in the prefix and still open at the cursor, outermost first."""
    suffix_closers: tuple[str, ...]
    """Kinds of the suffix's closers that close something opened before the cursor, in order."""
    state: State
    """The string or comment the cursor is in, if any."""
    quoted: frozenset[int]
    """Indexes of the prefix's lines that start inside a string or comment."""
    tabs: bool
    unit: int
    """Columns per indentation level (and per tab)."""
    inserts_lines: bool
    """The completion goes in as whole lines before the text after the cursor (the cursor is at the start of a
    line's content, and the model wrote a line break, or the rest of the line is indented)."""
    closes_rest: bool
    """The rest of the line is only closing characters and the model's text ends with them."""

    @property
    def line_before(self) -> str:
        """The cursor's line up to the cursor."""
        return self.before[-1]


def make_cursor(prefix: str, suffix: str, raw: str, language_id: str) -> Cursor:
    """Everything the filters need to know about the document, computed once."""
    language = language_for(language_id)
    before_text, after_text = normalise(prefix), normalise(suffix)
    document = scan_document(before_text, after_text, language, language_id)
    tokens, starts, state, suffix_tokens = document.before, document.starts, document.state, document.after
    before, (rest, *after) = before_text.split("\n"), after_text.split("\n")
    raw = normalise(raw)
    tabs, unit = indent_style(before, after, raw.split("\n"), language)
    at_line_start = not before[-1].strip() and bool(rest.strip())
    return Cursor(
        language=language,
        before=tuple(before),
        rest=rest,
        after=tuple(after),
        stack=tuple(pair_tokens(tokens)[0]),
        suffix_closers=tuple(token.kind for token in pair_tokens(suffix_tokens)[1]),
        state=state,
        quoted=frozenset(i for i, start in enumerate(starts) if start is not None),
        tabs=tabs,
        unit=unit,
        inserts_lines=at_line_start and ("\n" in raw.rstrip(" \t") or rest[0] in " \t"),
        closes_rest=only_closers(rest) and raw.rstrip().endswith(rest.strip()),
    )


def normalise(text: str) -> str:
    """LF line endings (LSP also counts a lone CR as a line break)."""
    return text.replace("\r\n", "\n").replace("\r", "\n")


def only_closers(rest: str) -> bool:
    """Whether the rest of the line is only closing characters (and spaces or tabs), and not blank."""
    return bool(rest.strip()) and all(char in CLOSING_CHARS or char in " \t" for char in rest)


def same_line(line: str, other: str, unit: int) -> bool:
    """Whether two lines hold the same code at the same column (blank lines never match)."""
    return bool(line.strip()) and line.strip() == other.strip() and columns(line, unit) == columns(other, unit)
