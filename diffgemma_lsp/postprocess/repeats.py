"""Step 3 of the pipeline: cut what the completion repeats of the text after the cursor.

:func:`trim_suffix_overlap` cuts the end that repeats the rest of the cursor's line, and
:func:`stop_before_repeated_line` stops where the completion starts repeating the lines after the cursor (it
runs once more on the final text in step 7).
"""

from __future__ import annotations

import itertools

from diffgemma_lsp.postprocess.cursor import Cursor, same_line

RUN = 3
"""Lines the completion must repeat of what follows it, when it goes on after that, to count as a repeat."""
MAX_OVERLAP = 256
"""Longest overlap looked for between the completion's end and the rest of the cursor's line."""


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
    while (cut := repeat_line(text, cursor)) is not None:
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


def repeat_line(text: str, cursor: Cursor) -> int | None:
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
        if not same_line(written[i], following[0], unit):
            continue
        tail = [written[j] for j in filled[position:]]
        run = 0
        for line, other in zip(tail, following, strict=False):
            if not same_line(line, other, unit):
                break
            run += 1
        if run == len(tail) or run >= RUN:
            return i
    return None
