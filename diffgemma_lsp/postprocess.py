"""Post-processing of the engine's raw middle: pure filters that make a completion land right.

:func:`postprocess` turns the model's text into an :class:`Edit` at the cursor. The filters work on LF text
and run in this order (line endings go back to the document's at the end):

0. With ``instruct=True`` (an instruction-tuned model answering the chat prompt): :func:`unwrap_answer` of
   :mod:`diffgemma_lsp.answer` first turns the answer into the text to insert: the body of its first code
   fence, without an echoed cursor marker or a repeat of the prefix's last lines at its start.
1. :func:`normalise`: CRLF and CR to LF.
2. :func:`fit_indentation`: the first line takes the indentation of the cursor's block, later lines keep
   theirs (relative to it when the model was off by the same amount everywhere), tabs or spaces as the
   document uses them.
3. :func:`trim_suffix_overlap`: cut the end that repeats the rest of the cursor's line, and stop where the
   completion starts repeating the lines after the cursor.
4. :func:`limit_scope`: end a multi-line completion where the cursor's block (Python: function) ends; then
   :func:`stop_before_open_string`: stop before the line that opens a string or block comment the completion
   leaves open, when code follows the cursor (a dangling triple quote would turn that code into string text).
5. :func:`balance_brackets`: drop a closing bracket (and what follows it) that the suffix already provides.
6. :func:`trim_whitespace`: trailing whitespace and trailing blank lines.
7. :func:`end_before_rest`: whole lines inserted before the text after the cursor end with a line break, and
   the repeat check of step 3 runs once more on the final text (then step 6 again).
8. :func:`fit_closers`: when the rest of the line is only closing characters, put a closing brace on its own
   line, and replace those characters (``replace_to_eol``) when the model wrote them itself.

Indentation comes before the overlap check because that check compares whole lines, indentation included;
scope comes before balancing so that a line closing the block is kept up to its closer, and the balancer then
decides from the suffix whether the closer stays. No pygls or torch here: the server builds the LSP items.
"""

from __future__ import annotations

import collections
import itertools

import attrs

from diffgemma_lsp.answer import unwrap_answer
from diffgemma_lsp.languages import (
    Blocks,
    Language,
    State,
    Token,
    code_of,
    columns,
    continues_block,
    indent_style,
    is_header,
    language_for,
    opens_block,
    pair_tokens,
    scan,
)

CLOSING_CHARS = frozenset(")]}'\"`;,")
"""What the rest of the line may hold for a completion to replace it (plus spaces and tabs)."""
RUN = 3
"""Lines the completion must repeat of what follows it, when it goes on after that, to count as a repeat."""
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


def postprocess(prefix: str, suffix: str, raw: str, language_id: str, *, instruct: bool = False) -> Edit | None:
    """The edit to offer for the model's ``raw`` middle between ``prefix`` and ``suffix``; None if nothing is left.

    ``instruct`` says ``raw`` is an instruction-tuned model's answer, which is unwrapped first (step 0).
    """
    if instruct:
        raw = unwrap_answer(raw, prefix, suffix)
    cursor = make_cursor(prefix, suffix, raw, language_id)
    text = normalise(raw)
    filters = (fit_indentation, trim_suffix_overlap, limit_scope, stop_before_open_string, balance_brackets)
    for step in (*filters, trim_whitespace):
        text = step(text, cursor)
    text = trim_whitespace(stop_before_repeated_line(end_before_rest(text, cursor), cursor), cursor)
    if not text.strip():
        return None
    text, replace = fit_closers(text, cursor)
    return Edit(text=text.replace("\n", _newline(prefix, suffix)), replace_to_eol=replace)


def make_cursor(prefix: str, suffix: str, raw: str, language_id: str) -> Cursor:
    """Everything the filters need to know about the document, computed once."""
    language = language_for(language_id)
    before_text, after_text = normalise(prefix), normalise(suffix)
    tokens, starts, state = scan(before_text, language)
    suffix_tokens, _, _ = scan(after_text, language, state)
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
        closes_rest=_only_closers(rest) and raw.rstrip().endswith(rest.strip()),
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
        k, typed, anchor, below = first
        own = columns(lines[k], cursor.unit)
        old = own if k > 0 or own > 0 else typed
        # What the model wrote past the end of the middle (a copy of the suffix, the next function) tells nothing.
        end = min((n for n in (_repeat_line(text, cursor), _scope_end(text, cursor)) if n is not None), default=None)
        later = [line for line in lines[k + 1 : end] if line.strip()]
        target, shift = old, 0
        if not _consistent(lines[k], old, later, anchor, below, typed, cursor):
            target, shift = _refit(lines[k], old, later, anchor, below, typed, cursor)
        if target < typed:
            target, shift = typed, typed - old
        start = k + 1
        lead = _render(target, cursor)
        if k == 0:
            line = cursor.line_before
            lead = lead[len(line) :] if lead.startswith(line) else _render(target - typed, cursor)
        lines[k] = lead + lines[k].lstrip(" \t")
    for j in range(start, len(lines)):
        if lines[j].strip():
            lines[j] = _render(max(0, columns(lines[j], cursor.unit) + shift), cursor) + lines[j].lstrip(" \t")
    return "\n".join(lines)


def _refit(
    first: str, old: int, later: list[str], anchor: str | None, below: str | None, typed: int, cursor: Cursor
) -> tuple[int, int]:
    """(columns for the first line, shift for the later lines) when the model's indentation does not fit.

    A model that gets only its first line wrong (a missing or doubled indentation) writes the later lines at
    their right columns: the first line goes where the next line says (a level above it after a header), or
    else to the nearest column that fits, and the later lines stay. One that ignored the block writes every
    line off by the same amount: the first line moves to the nearest column that fits, the others with it.
    (On HumanEval-infilling with the first line's indentation removed, this order restores the most tasks.)
    """
    unit, language = cursor.unit, cursor.language
    opens = opens_block(first, language)
    limits = _indentation_range(anchor, below, opens, cursor)
    if limits is None:
        return old, 0
    low, high = limits
    nearest = min(max(old, low), high)
    candidates = [nearest]
    following = later[0] if later else below if below is not None and not continues_block(below, language) else None
    if following is not None:
        cols = columns(following, unit)
        candidates.insert(0, cols - unit if opens else cols + (unit if continues_block(following, language) else 0))
    for target in candidates:
        if low <= target <= high and _consistent(first, target, later, anchor, below, typed, cursor):
            return target, 0
    return nearest, nearest - old


def _consistent(
    first: str, cols: int, later: list[str], anchor: str | None, below: str | None, typed: int, cursor: Cursor
) -> bool:
    """Whether the completion fits with its first line at ``cols`` and the later lines where they are.

    The first line follows the line above (one level deeper after a header, else no deeper), each line follows
    the one before it, the last leads into the line below, and none leaves the function the cursor is in. More
    than one level after a header is allowed where the line below is that deep, and in Python when the model
    chose the whole indentation (nothing typed): it is valid there, and changing it could move the lines after
    it into another block.
    """
    language, unit = cursor.language, cursor.unit
    if anchor is not None:
        level = columns(anchor, unit)
        if opens_block(anchor, language):
            evidence = below is not None and not continues_block(below, language) and columns(below, unit) == cols
            free = evidence or (language.blocks is Blocks.INDENT and not typed)
            if not (level < cols <= level + unit or (cols > level and free)):
                return False
        elif cols > level:
            return False
        scopes = _enclosing_scopes(cursor, level + 1) if language.scope else []
        if scopes and min([cols, *(columns(line, unit) for line in later)]) < scopes[-1]:
            return False
    if later and not _leads_into(first, cols, later[0], cursor):
        return False
    last, last_cols = (later[-1], columns(later[-1], unit)) if later else (first, cols)
    return below is None or _leads_into(last, last_cols, below, cursor)


def _leads_into(line: str, cols: int, below: str, cursor: Cursor) -> bool:
    """Whether ``below`` can follow ``line`` at ``cols``: deeper after a header (or continuing it at the same
    level, like ``else:``), else no deeper, and shallower when it closes a block."""
    level = columns(below, cursor.unit)
    if opens_block(line, cursor.language):
        return level > cols or continues_block(below, cursor.language) and level == cols
    return level < cols if continues_block(below, cursor.language) else level <= cols


def _first_content_line(lines: list[str], cursor: Cursor) -> tuple[int, int, str | None, str | None] | None:
    """(index of the completion's first non-blank line, columns typed before it, the lines above and below it)."""
    k = next((i for i, line in enumerate(lines) if line.strip()), None)
    if k is None:
        return None
    below = _next_line(cursor)
    if not cursor.line_before.strip():
        if cursor.rest.strip():
            if not cursor.inserts_lines:
                return None  # a word typed in front of the line's text
            below = cursor.line_before + cursor.rest
        typed = columns(cursor.line_before, cursor.unit) if k == 0 else 0
        return k, typed, _previous_line(cursor), below
    if k == 0:
        return None  # the completion continues the cursor's line
    return k, 0, cursor.line_before, None if cursor.rest.strip() else below


def _indentation_range(anchor: str | None, below: str | None, opens: bool, cursor: Cursor) -> tuple[int, int] | None:
    """The columns a first line may take between the line above and the line below (None: no line above).

    ``opens`` says the first line is a header, so the line below may be one level deeper than it.
    """
    language, unit = cursor.language, cursor.unit
    if anchor is None:
        return None
    after_header = opens_block(anchor, language)
    inner = {"(", "[", "{"} if language.blocks is Blocks.INDENT else {"(", "["}
    if cursor.stack and cursor.stack[-1].kind in inner and not anchor.rstrip().endswith(("(", "[", "{")):
        return columns(anchor, unit), columns(anchor, unit)  # the next item inside brackets: as the one above
    high = columns(anchor, unit) + (unit if after_header else 0)
    if after_header:
        low = high
    elif below is None:
        low = 0
    elif continues_block(below, language):
        low = min(columns(below, unit) + unit, high)
    else:
        low = min(max(0, columns(below, unit) - (unit if opens else 0)), high)
    scopes = _enclosing_scopes(cursor, columns(anchor, unit) + 1) if language.scope else []
    if scopes:
        low = min(max(low, scopes[-1] - 1 + unit), high)  # not out of the function the cursor is in
    return low, high


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
    if cursor.rest.strip() and not cursor.inserts_lines:
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
    """Stop where the completion starts repeating the lines that will follow it (indentation included).

    Those are the cursor's line when the completion ends with a line break before the rest of it, then the
    suffix's non-empty lines. A line that equals the first of them is where the repeat starts if the lines
    after it go on matching to the end of the completion, or for RUN lines: a line the model wrote that just
    happens to equal the next one is kept.
    """
    while (cut := _repeat_line(text, cursor)) is not None:
        if cut == 0:
            return ""
        lines = text.split("\n")
        text = "\n".join(lines[:cut] + lines[-1:] if _ends_line(lines, cursor) else lines[:cut])
        if not cursor.rest.strip():
            text = text.rstrip()
    return text


def _ends_line(lines: list[str], cursor: Cursor) -> bool:
    """Whether the completion ends with a line break (and indentation) in front of the rest of the line."""
    return len(lines) > 1 and not lines[-1].strip() and bool(cursor.rest.strip())


def _repeat_line(text: str, cursor: Cursor) -> int | None:
    """The index of the completion's line where it starts repeating what follows it, if it does."""
    lines = text.split("\n")
    ends_line = _ends_line(lines, cursor)
    own = lines[:-1] if ends_line else lines
    joins_rest = not ends_line and not cursor.inserts_lines
    written = [
        (cursor.line_before if i == 0 else "") + line + (cursor.rest if joins_rest and i == len(lines) - 1 else "")
        for i, line in enumerate(own)
    ]
    following = [(cursor.line_before if cursor.inserts_lines else lines[-1]) + cursor.rest] if not joins_rest else []
    following += itertools.islice((line for line in cursor.after if line.strip()), len(own) + RUN)
    return _repeat_start(written, following, cursor.unit)


def _repeat_start(written: list[str], following: list[str], unit: int) -> int | None:
    """The index of the line where ``written`` starts repeating ``following``, if it does."""
    if not following:
        return None
    filled = [i for i, line in enumerate(written) if line.strip()]
    for position, i in enumerate(filled):
        if not _same_line(written[i], following[0], unit):
            continue
        tail = [written[j] for j in filled[position:]]
        run = 0
        for line, other in zip(tail, following, strict=False):
            if not _same_line(line, other, unit):
                break
            run += 1
        if run == len(tail) or run >= RUN:
            return i
    return None


def _same_line(line: str, other: str, unit: int) -> bool:
    return bool(line.strip()) and line.strip() == other.strip() and columns(line, unit) == columns(other, unit)


# --- 4. scope ----------------------------------------------------------------------------------------------


def limit_scope(text: str, cursor: Cursor) -> str:
    """End a multi-line completion at the end of the cursor's block (by brackets/keywords or by indentation)."""
    end = _scope_end(text, cursor)
    return text if end is None else "\n".join(text.split("\n")[:end])


def _scope_end(text: str, cursor: Cursor) -> int | None:
    """The number of the completion's lines inside the cursor's scope (None: all of them)."""
    lines = text.split("\n")
    if len(lines) < 2:
        return None
    tokens, starts, end_state = scan(text, cursor.language, cursor.state)
    if cursor.language.blocks is Blocks.INDENT:
        return _indent_scope_end(lines, tokens, [*starts[1:], end_state], cursor)
    return _bracket_scope_end(tokens, cursor)


def _bracket_scope_end(tokens: list[Token], cursor: Cursor) -> int | None:
    """The number of lines up to the one that closes the block around the cursor and opens nothing after it.

    ``} else {`` closes the block and opens the next one, so the completion goes on after it.
    """
    local: list[str] = []
    closed = False
    by_line = _by_line(tokens)
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
    depth, by_line = len(cursor.stack), _by_line(tokens)
    starts_at: list[int] = []
    ends_at: list[int] = []
    for j in range(len(lines)):
        starts_at.append(depth)
        for token in by_line.get(j, ()):
            depth = depth + 1 if token.opens else max(0, depth - 1)
        ends_at.append(depth)
    first_line = cursor.line_before + lines[0]
    if cursor.stack:
        base, first = columns(cursor.before[cursor.stack[0].line], unit), 0
    elif cursor.line_before.strip():
        base, first = columns(cursor.line_before, unit), 0
    else:
        k = next((i for i, line in enumerate(lines) if line.strip()), None)
        if k is None:
            return None
        base, first = columns(first_line if k == 0 else lines[k], unit), k
    statement_end = next((j for j in range(first, len(lines)) if ends_at[j] == 0 and ends[j] is None), None)
    if statement_end is None:
        return None
    on_statement = bool(cursor.stack) or bool(cursor.line_before.strip())
    header = on_statement and is_header(first_line if statement_end == 0 else lines[statement_end], language)
    statement = cursor.before[cursor.stack[0].line] if cursor.stack else first_line
    inner = outer = base + header
    if language.scope is not None:
        scopes = _enclosing_scopes(cursor, base)
        if header and language.scope.match(statement):
            scopes.insert(0, base + 1)
        inner, outer, header = (scopes[0], scopes[-1], False) if scopes else (0, 0, False)
    for j in range(statement_end + 1, len(lines)):
        line = lines[j]
        if not line.strip() or starts_at[j] > 0 or ends[j - 1] is not None:
            continue
        cols = columns(line, unit)
        if header and cols == base and continues_block(line, language):
            continue
        if cols < outer or (cols < inner and (language.scope is None or language.scope.match(line))):
            return j
    return None


def _enclosing_scopes(cursor: Cursor, level: int) -> list[int]:
    """Body columns of the scopes (``def``, ``class``) around a statement at ``level``, innermost first."""
    assert cursor.language.scope is not None
    scopes: list[int] = []
    start = cursor.stack[0].line if cursor.stack else len(cursor.before) - 1
    for number in range(start - 1, -1, -1):
        line = cursor.before[number]
        if level == 0:
            break
        if number in cursor.quoted or not code_of(line, cursor.language).strip():
            continue
        cols = columns(line, cursor.unit)
        if cols < level:
            if cursor.language.scope.match(line):
                scopes.append(cols + 1)
            level = cols
    return scopes


def _by_line(tokens: list[Token]) -> dict[int, list[Token]]:
    by_line: dict[int, list[Token]] = collections.defaultdict(list)
    for token in tokens:
        by_line[token.line].append(token)
    return by_line


def stop_before_open_string(text: str, cursor: Cursor) -> str:
    """Stop before the line where the completion opens a string or block comment that it leaves open.

    Only when code follows the cursor, which the open string would swallow; and not when the cursor is already
    inside a string or comment, where closing it or not is the completion's own business. The rest of the
    cursor's line counts as the completion's end (it may close what the completion opened).
    """
    if cursor.state is not None or not any(line.strip() for line in (cursor.rest, *cursor.after)):
        return text
    _, starts, end_state = scan(text + cursor.rest, cursor.language)
    if end_state is None or end_state[0] == "\n":  # all closed, or a line comment, which ends with its line
        return text
    opened = max(number for number, start in enumerate(starts) if start is None)  # the line that opened it
    return "\n".join(text.split("\n")[:opened])


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
    if lines[-1].strip() and cursor.rest[:1] in (" ", "\t"):
        lines[-1] = lines[-1].rstrip(" \t")
    if len(lines) > 1 and not lines[-1].strip():
        while len(lines) > 2 and not lines[-2]:
            del lines[-2]
    return "\n".join(lines)


# --- 7. closing characters after the cursor ----------------------------------------------------------------


def end_before_rest(text: str, cursor: Cursor) -> str:
    """When whole lines go in before the text after the cursor, end them with a line break and the indentation
    that text had, so it keeps its line and its column."""
    if not cursor.inserts_lines:
        return text
    lines = text.split("\n")
    if len(lines) > 1 and not lines[-1].strip():
        lines.pop()
    return "\n".join([*lines, cursor.line_before])


def fit_closers(text: str, cursor: Cursor) -> tuple[str, bool]:
    """When the rest of the line is only closers: a brace goes on its own line; replace it if the model wrote it.

    When the model's raw text ended with the rest of the line, the closers are kept in the text and the edit
    replaces the rest of the line (LSP 3.18 inline items need a range on one line).
    """
    rest = cursor.rest
    if not _only_closers(rest):
        return text, False
    last = text.rsplit("\n", 1)[-1]
    brace = "\n" in text and last.strip() and rest.lstrip(" \t").startswith("}")
    opener = _opener_line(text, cursor) if brace else None
    if opener is not None:
        indentation = opener[: len(opener) - len(opener.lstrip(" \t"))]
        if not _same_line(last, indentation + rest, cursor.unit):
            text += "\n" + indentation
    if cursor.closes_rest:
        return text + rest.rstrip(), True
    return text, False


def _opener_line(text: str, cursor: Cursor) -> str | None:
    """The line holding the innermost bracket still open after the completion (None if nothing is open)."""
    still_open, closed = pair_tokens(scan(text, cursor.language, cursor.state)[0])
    if still_open:
        line = still_open[-1].line
        return (cursor.line_before if line == 0 else "") + text.split("\n")[line]
    remaining = cursor.stack[: max(0, len(cursor.stack) - len(closed))]
    return cursor.before[remaining[-1].line] if remaining else None


def _only_closers(rest: str) -> bool:
    return bool(rest.strip()) and all(char in CLOSING_CHARS or char in " \t" for char in rest)
