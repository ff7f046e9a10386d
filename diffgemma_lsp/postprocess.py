"""Post-processing of the engine's raw middle: pure filters that make a completion land right.

:func:`postprocess` turns the model's text into an :class:`Edit` at the cursor. The filters work on LF text
and run in this order (line endings go back to the document's at the end):

1. :func:`normalise`: CRLF and CR to LF.
2. :func:`fit_indentation`: the first line takes the indentation of the cursor's block; later lines keep
   theirs relative to it; tabs or spaces as the document uses them.
3. :func:`trim_suffix_overlap`: cut the end that repeats the rest of the cursor's line, and stop before a
   line that repeats the next non-empty line after the cursor.
4. :func:`limit_scope`: end a multi-line completion where the cursor's block ends.
5. :func:`balance_brackets`: drop a closing bracket (and what follows it) that the suffix already provides.
6. :func:`trim_whitespace`: trailing whitespace and trailing blank lines (the repeat check runs once more).
7. :func:`fit_closers`: when the rest of the line is only closing characters, put a closing brace on its own
   line, and replace those characters (``replace_to_eol``) when the model wrote them itself.

Indentation comes before the overlap check because that check compares whole lines, indentation included;
scope comes before balancing so that a line closing the block is kept up to its closer, and the balancer then
decides from the suffix whether the closer stays. No pygls or torch here: the server builds the LSP items.
"""

from __future__ import annotations

import collections

import attrs

from diffgemma_lsp.languages import (
    Blocks,
    Language,
    State,
    Token,
    continues_block,
    is_header,
    language_for,
    opens_block,
    scan,
)

CLOSING_CHARS = frozenset(")]}'\"`;,")
"""What the rest of the line may hold for a completion to replace it (plus spaces and tabs)."""
MAX_OVERLAP = 256
"""Longest overlap looked for between the completion's end and the rest of the cursor's line."""


@attrs.frozen(kw_only=True)
class Edit:
    """What to put at the cursor."""

    text: str
    """The text to insert at the cursor, in the document's line endings."""
    replace_to_eol: bool
    """True when ``text`` also replaces the rest of the cursor's line (which holds only closing characters)."""


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
    tabs: bool
    unit: int
    """Columns per indentation level (and per tab)."""

    @property
    def line_before(self) -> str:
        """The cursor's line up to the cursor."""
        return self.before[-1]


def postprocess(prefix: str, suffix: str, raw: str, language_id: str) -> Edit | None:
    """The edit to offer for the model's ``raw`` middle between ``prefix`` and ``suffix``; None if nothing is left."""
    cursor = make_cursor(prefix, suffix, raw, language_id)
    text = normalise(raw)
    model_closed = _closes_rest(text, cursor)
    for step in (fit_indentation, trim_suffix_overlap, limit_scope, balance_brackets, trim_whitespace):
        text = step(text, cursor)
    text = trim_whitespace(stop_before_repeated_line(text, cursor), cursor)
    if not text.strip():
        return None
    text, replace = fit_closers(text, cursor, model_closed)
    return Edit(text=text.replace("\n", _newline(prefix, suffix)), replace_to_eol=replace)


def make_cursor(prefix: str, suffix: str, raw: str, language_id: str) -> Cursor:
    """Everything the filters need to know about the document, computed once."""
    language = language_for(language_id)
    before_text, after_text = normalise(prefix), normalise(suffix)
    tokens, _, state = scan(before_text, language)
    suffix_tokens, _, _ = scan(after_text, language, state)
    before, (rest, *after) = before_text.split("\n"), after_text.split("\n")
    tabs, unit = _indent_style(before, after, raw, language)
    return Cursor(
        language=language,
        before=tuple(before),
        rest=rest,
        after=tuple(after),
        stack=_open_stack(tokens),
        suffix_closers=tuple(token.kind for token in _outer_closers(suffix_tokens)),
        state=state,
        tabs=tabs,
        unit=unit,
    )


# --- 1. line endings ---------------------------------------------------------------------------------------


def normalise(text: str) -> str:
    """LF line endings (LSP also counts a lone CR as a line break)."""
    return text.replace("\r\n", "\n").replace("\r", "\n")


def _newline(prefix: str, suffix: str) -> str:
    text = prefix + suffix
    crlf = text.count("\r\n")
    return "\r\n" if crlf and crlf >= text.count("\n") - crlf else "\n"


# --- 2. indentation ----------------------------------------------------------------------------------------


def fit_indentation(text: str, cursor: Cursor) -> str:
    """Give the first line the indentation of the cursor's block; shift later lines with it; fix tabs/spaces."""
    lines = text.split("\n")
    shift, start = 0, 1
    first = _first_content_line(lines, cursor)
    if first is not None:
        k, typed, anchor = first
        own = _cols(lines[k], cursor.unit)
        old = own if k > 0 or own > 0 else typed
        target = max(typed, _block_indentation(old, anchor, cursor))
        shift, start = target - old, k + 1
        lead = _render(target, cursor)
        if k == 0:
            line = cursor.line_before
            lead = lead[len(line) :] if lead.startswith(line) else _render(target - typed, cursor)
        lines[k] = lead + lines[k].lstrip(" \t")
    for j in range(start, len(lines)):
        if lines[j].strip():
            lines[j] = _render(max(0, _cols(lines[j], cursor.unit) + shift), cursor) + lines[j].lstrip(" \t")
    return "\n".join(lines)


def _first_content_line(lines: list[str], cursor: Cursor) -> tuple[int, int, str | None] | None:
    """(index of the completion's first non-blank line, columns already typed before it, the line above it)."""
    k = next((i for i, line in enumerate(lines) if line.strip()), None)
    if k is None:
        return None
    if not cursor.line_before.strip():
        if cursor.rest.strip():
            return None
        typed = _cols(cursor.line_before, cursor.unit) if k == 0 else 0
        return k, typed, _previous_line(cursor)
    if k == 0:
        return None  # the completion continues the cursor's line
    return k, 0, cursor.line_before


def _block_indentation(old: int, anchor: str | None, cursor: Cursor) -> int:
    """``old`` moved into the range of indentations that fit between the line above and the line below."""
    language, unit = cursor.language, cursor.unit
    if anchor is None:
        return old
    opens = opens_block(anchor, language)
    inner = {"(", "[", "{"} if language.blocks is Blocks.INDENT else {"(", "["}
    if cursor.stack and cursor.stack[-1].kind in inner and not anchor.rstrip().endswith(("(", "[", "{")):
        return old  # a continuation line inside brackets: alignment is free
    high = _cols(anchor, unit) + (unit if opens else 0)
    below = _next_line(cursor) if not cursor.rest.strip() else None
    if opens:
        low = high
    elif below is None:
        low = 0
    elif continues_block(below, language):
        low = min(_cols(below, unit) + unit, high)
    else:
        low = min(_cols(below, unit), high)
    return min(max(old, low), high)


def _indent_style(before: list[str], after: list[str], raw: str, language: Language) -> tuple[bool, int]:
    """(tabs?, columns per level) as the document shows them, else the language's, else the completion's."""
    tab_lines = space_lines = 0
    steps: collections.Counter[int] = collections.Counter()
    previous: int | None = None
    for line in (*before[-300:], *after[:100]):
        if not line.strip():
            continue
        lead = line[: len(line) - len(line.lstrip(" \t"))]
        tab_lines += lead.startswith("\t")
        space_lines += lead.startswith(" ")
        width = None if "\t" in lead else len(lead)
        if width is not None and previous is not None and 0 < width - previous <= 8:
            steps[width - previous] += 1
        previous = width
    if tab_lines or space_lines:
        tabs = tab_lines > space_lines
    elif language.tabs is not None:
        tabs = language.tabs
    else:
        tabs = any(line.startswith("\t") for line in normalise(raw).split("\n"))
    if tabs:
        return True, 4
    return False, steps.most_common(1)[0][0] if steps else language.unit


def _cols(line: str, unit: int) -> int:
    """Width of the line's leading whitespace, tabs stopping every ``unit`` columns."""
    cols = 0
    for char in line:
        if char == " ":
            cols += 1
        elif char == "\t":
            cols = (cols // unit + 1) * unit
        else:
            break
    return cols


def _render(cols: int, cursor: Cursor) -> str:
    if cursor.tabs:
        return "\t" * (cols // cursor.unit) + " " * (cols % cursor.unit)
    return " " * cols


def _previous_line(cursor: Cursor) -> str | None:
    return next((line for line in reversed(cursor.before[:-1]) if line.strip()), None)


def _next_line(cursor: Cursor) -> str | None:
    return next((line for line in cursor.after if line.strip()), None)


# --- 3. overlap with the suffix ----------------------------------------------------------------------------


def trim_suffix_overlap(text: str, cursor: Cursor) -> str:
    """Cut what repeats the rest of the cursor's line; stop before a line that repeats the next line."""
    if cursor.rest.strip():
        text = _cut_rest_overlap(text, cursor)
    return stop_before_repeated_line(text, cursor)


def _cut_rest_overlap(text: str, cursor: Cursor) -> str:
    """Remove the longest end of the completion that the rest of the line starts with, at token boundaries.

    An overlap of closing brackets alone is left to :func:`balance_brackets`, which can tell whether the
    model's bracket closes something of its own.
    """
    rest = cursor.rest.lstrip(" \t")
    body = text.rstrip(" \t")
    last = body.rsplit("\n", 1)[-1]
    joined = (cursor.line_before if "\n" not in body else "") + last
    for size in range(min(len(rest), len(last), MAX_OVERLAP), 0, -1):
        piece = rest[:size]
        if not last.endswith(piece) or not piece.strip(")]} \t"):
            continue
        previous = joined[-size - 1] if len(joined) > size else ""
        if (_is_word(previous) and _is_word(piece[0])) or (_is_word(piece[-1]) and _is_word(rest[size : size + 1])):
            continue
        kept = body[: len(body) - size]
        return kept.rstrip(" \t") if cursor.rest[:1] in (" ", "\t") else kept
    return text


def _is_word(char: str) -> bool:
    return char.isalnum() or char == "_"


def stop_before_repeated_line(text: str, cursor: Cursor) -> str:
    """Stop before the first line that equals (indentation included) the next non-empty line after the cursor."""
    below = _next_line(cursor)
    if below is None:
        return text
    while True:
        lines = text.split("\n")
        for i, line in enumerate(lines):
            line = (cursor.line_before if i == 0 else "") + line + (cursor.rest if i == len(lines) - 1 else "")
            if _same_line(line, below, cursor.unit):
                break
        else:
            return text
        text = "\n".join(lines[:i])
        if not cursor.rest.strip():
            text = text.rstrip()


def _same_line(line: str, other: str, unit: int) -> bool:
    return bool(line.strip()) and line.strip() == other.strip() and _cols(line, unit) == _cols(other, unit)


# --- 4. scope ----------------------------------------------------------------------------------------------


def limit_scope(text: str, cursor: Cursor) -> str:
    """End a multi-line completion at the end of the cursor's block (by brackets/keywords or by indentation)."""
    lines = text.split("\n")
    if len(lines) < 2:
        return text
    tokens, starts, end_state = scan(text, cursor.language, cursor.state)
    if cursor.language.blocks is Blocks.INDENT:
        end = _indent_scope_end(lines, tokens, [*starts[1:], end_state], cursor)
    else:
        end = _bracket_scope_end(tokens, cursor)
    return text if end is None else "\n".join(lines[:end])


def _bracket_scope_end(tokens: list[Token], cursor: Cursor) -> int | None:
    """The number of lines up to the one that closes the block around the cursor and opens nothing after it.

    ``} else {`` closes the block and opens the next one, so the completion goes on after it.
    """
    local: list[str] = []
    closed = False
    by_line = collections.defaultdict(list)
    for token in tokens:
        by_line[token.line].append(token)
    for line in sorted(by_line):
        for token in by_line[line]:
            if token.opens:
                local.append(token.kind)
            elif token.kind in local:
                while local.pop() != token.kind:
                    pass
            elif token.kind in cursor.language.block_kinds:
                closed, local = True, []
        if closed and not local:
            return line + 1
    return None


def _indent_scope_end(lines: list[str], tokens: list[Token], ends: list[State], cursor: Cursor) -> int | None:
    """The index of the first line that dedents below the cursor's block (brackets and strings excepted)."""
    unit, language = cursor.unit, cursor.language
    depth, starts_at, ends_at, by_line = len(cursor.stack), [], [], collections.defaultdict(list)
    for token in tokens:
        by_line[token.line].append(token)
    for j in range(len(lines)):
        starts_at.append(depth)
        for token in by_line[j]:
            depth = depth + 1 if token.opens else max(0, depth - 1)
        ends_at.append(depth)
    first_line = cursor.line_before + lines[0]
    if cursor.stack:
        base, first = _cols(cursor.before[cursor.stack[0].line], unit), 0
    elif cursor.line_before.strip():
        base, first = _cols(cursor.line_before, unit), 0
    else:
        k = next((i for i, line in enumerate(lines) if line.strip()), None)
        if k is None:
            return None
        base, first = _cols(first_line if k == 0 else lines[k], unit), k
    statement_end = next((j for j in range(first, len(lines)) if ends_at[j] == 0 and ends[j] is None), None)
    if statement_end is None:
        return None
    header = is_header(first_line if statement_end == 0 else lines[statement_end], language)
    for j in range(statement_end + 1, len(lines)):
        line = lines[j]
        if not line.strip() or starts_at[j] > 0 or ends[j - 1] is not None:
            continue
        cols = _cols(line, unit)
        if cols < base + header and not (header and cols == base and continues_block(line, language)):
            return j
    return None


# --- 5. brackets -------------------------------------------------------------------------------------------


def balance_brackets(text: str, cursor: Cursor) -> str:
    """Cut the completion at the first closer that would close what the suffix already closes.

    Cutting before each closer that closes something opened before the cursor is a candidate, and so is
    keeping everything. Each is scored by the closers that close the wrong kind of bracket plus the suffix's
    closers left unmatched by what is open after the completion; the lowest score wins, ties keep more text.
    """
    prefix = [token.kind for token in cursor.stack]
    local: list[str] = []
    mismatches = 0
    candidates: list[tuple[int, Token]] = []
    for token in scan(text, cursor.language, cursor.state)[0]:
        if token.opens:
            local.append(token.kind)
        elif token.kind in local:
            while local.pop() != token.kind:
                pass
        else:
            candidates.append((mismatches + _unmatched(cursor.suffix_closers, prefix + local), token))
            if prefix:
                mismatches += prefix.pop() != token.kind
    best = mismatches + _unmatched(cursor.suffix_closers, prefix + local)
    cut: Token | None = None
    for score, token in reversed(candidates):
        if score < best:
            best, cut = score, token
    if cut is None:
        return text
    lines = text.split("\n")
    return text[: sum(len(line) + 1 for line in lines[: cut.line]) + cut.column]


def _unmatched(closers: tuple[str, ...], stack: list[str]) -> int:
    """How many of ``closers`` do not close the top of ``stack`` in turn."""
    stack = list(stack)
    unmatched = 0
    for kind in closers:
        if stack and stack[-1] == kind:
            stack.pop()
        else:
            unmatched += 1
    return unmatched


def _outer_closers(tokens: list[Token]) -> list[Token]:
    """The closers among ``tokens`` that close something opened before them (not by an opener in ``tokens``)."""
    local: list[str] = []
    outer: list[Token] = []
    for token in tokens:
        if token.opens:
            local.append(token.kind)
        elif token.kind in local:
            while local.pop() != token.kind:
                pass
        else:
            outer.append(token)
    return outer


def _open_stack(tokens: list[Token]) -> tuple[Token, ...]:
    """Openers left open at the end of ``tokens``; a closer with no opener closes something before the window."""
    stack: list[Token] = []
    for token in tokens:
        if token.opens:
            stack.append(token)
        elif any(opener.kind == token.kind for opener in stack):
            while stack.pop().kind != token.kind:
                pass
    return tuple(stack)


# --- 6. whitespace -----------------------------------------------------------------------------------------


def trim_whitespace(text: str, cursor: Cursor) -> str:
    """Trailing whitespace on each line and trailing blank lines, except what the rest of the line needs.

    When the rest of the cursor's line is not blank it follows the completion's last line, so that line keeps
    its trailing spaces, and a final line break (with the indentation after it) stays.
    """
    lines = text.split("\n")
    if not cursor.rest.strip():
        return "\n".join(line.rstrip() for line in lines).rstrip()
    lines[:-1] = [line.rstrip() for line in lines[:-1]]
    if len(lines) > 1 and not lines[-1].strip():
        while len(lines) > 2 and not lines[-2]:
            del lines[-2]
    return "\n".join(lines)


# --- 7. closing characters after the cursor ----------------------------------------------------------------


def fit_closers(text: str, cursor: Cursor, model_closed: bool) -> tuple[str, bool]:
    """When the rest of the line is only closers: a brace goes on its own line; replace it if the model wrote it.

    ``model_closed`` says the model's raw text ended with the rest of the line. Then the closers are kept in
    the text and the edit replaces the rest of the line (LSP 3.18 inline items need a range on one line).
    """
    rest = cursor.rest
    if not _only_closers(rest):
        return text, False
    last = text.rsplit("\n", 1)[-1]
    if "\n" in text and last.strip() and rest.lstrip(" \t").startswith("}"):
        line = _opener_line(text, cursor)
        text += "\n" + line[: len(line) - len(line.lstrip(" \t"))]
    if model_closed:
        return text + rest.rstrip(), True
    return text, False


def _opener_line(text: str, cursor: Cursor) -> str:
    """The line holding the innermost bracket still open after the completion (the cursor's line if none)."""
    lines = text.split("\n")
    lines[0] = cursor.line_before + lines[0]
    stack = [(token.kind, cursor.before[token.line]) for token in cursor.stack]
    for token in scan(text, cursor.language, cursor.state)[0]:
        if token.opens:
            stack.append((token.kind, lines[token.line]))
        elif any(kind == token.kind for kind, _ in stack):
            while stack.pop()[0] != token.kind:
                pass
    return stack[-1][1] if stack else cursor.line_before


def _only_closers(rest: str) -> bool:
    return bool(rest.strip()) and all(char in CLOSING_CHARS or char in " \t" for char in rest)


def _closes_rest(text: str, cursor: Cursor) -> bool:
    return _only_closers(cursor.rest) and text.rstrip().endswith(cursor.rest.strip())
