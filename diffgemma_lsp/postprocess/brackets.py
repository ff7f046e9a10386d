"""Steps 5 and 8 of the pipeline: closing brackets against what the text after the cursor already closes.

:func:`balance_brackets` (step 5) drops a closing bracket, and what follows it, that the suffix already
provides. :func:`fit_closers` (step 8) handles a rest of the line that is only closing characters: a closing
brace goes on its own line, and the edit replaces those characters when the model wrote them itself.
"""

from __future__ import annotations

from diffgemma_lsp.postprocess.cursor import Cursor, only_closers, same_line
from diffgemma_lsp.postprocess.languages import Token, pair_tokens, scan

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


# --- 8. closing characters after the cursor ----------------------------------------------------------------


def fit_closers(text: str, cursor: Cursor) -> tuple[str, bool]:
    """When the rest of the line is only closers: a brace goes on its own line; replace it if the model wrote it.

    When the model's raw text ended with the rest of the line, the closers are kept in the text and the edit
    replaces the rest of the line (LSP 3.18 inline items need a range on one line).
    """
    rest = cursor.rest
    if not only_closers(rest):
        return text, False
    last = text.rsplit("\n", 1)[-1]
    brace = "\n" in text and last.strip() and rest.lstrip(" \t").startswith("}")
    opener = _opener_line(text, cursor) if brace else None
    if opener is not None:
        indentation = opener[: len(opener) - len(opener.lstrip(" \t"))]
        if not same_line(last, indentation + rest, cursor.unit):
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
