"""Step 4 of the pipeline: end the completion where the cursor's block ends, or before a string it leaves open.

:func:`limit_scope` ends a multi-line completion where the cursor's block (Python: function) ends;
:func:`stop_before_open_string` stops before the line that opens a string or block comment the completion
leaves open, when code follows the cursor (a dangling triple quote would turn that code into string text).
"""

from __future__ import annotations

import collections

from diffgemma_lsp.postprocess.cursor import Cursor
from diffgemma_lsp.postprocess.languages import Blocks, State, Token, code_of, columns, continues_block, is_header, scan


def limit_scope(text: str, cursor: Cursor) -> str:
    """End a multi-line completion at the end of the cursor's block (by brackets/keywords or by indentation)."""
    end = scope_end(text, cursor)
    return text if end is None else "\n".join(text.split("\n")[:end])


def scope_end(text: str, cursor: Cursor) -> int | None:
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
        scopes = enclosing_scopes(cursor, base)
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


def enclosing_scopes(cursor: Cursor, level: int) -> list[int]:
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
