"""Step 2 of the pipeline: fit the completion's indentation to the cursor's block.

The first line takes the indentation of the cursor's block, later lines keep theirs (relative to it when the
model was off by the same amount everywhere), tabs or spaces as the document uses them. A replacement of a
selection is fitted to the selection instead (:func:`fit_to_selection`).
"""

from __future__ import annotations

from diffgemma_lsp.postprocess.cursor import Cursor
from diffgemma_lsp.postprocess.languages import Blocks, columns, continues_block, opens_block
from diffgemma_lsp.postprocess.repeats import repeat_line
from diffgemma_lsp.postprocess.scope import enclosing_scopes, scope_end


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
        end = min((n for n in (repeat_line(text, cursor), scope_end(text, cursor)) if n is not None), default=None)
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


def fit_to_selection(text: str, selection: str, cursor: Cursor) -> str:
    """A replacement's later lines moved by as many columns as its first line that starts a document line needs to
    sit where the selection's first such line sits (tabs or spaces as the document uses them).

    The lines keep their indentation relative to each other. The replacement's first line is left as it is: its
    leading whitespace becomes the selection's (``postprocess.replacement``). Unchanged where either has no line
    that starts a document line (a selection inside one line).
    """
    lines = text.split("\n")
    ours, theirs = _line_start_anchor(lines, cursor), _line_start_anchor(selection.split("\n"), cursor)
    if ours is None or theirs is None:
        return text
    shift = theirs[1] - ours[1]
    for j in range(max(ours[0], 1), len(lines)):
        if lines[j].strip():
            lines[j] = _render(max(0, columns(lines[j], cursor.unit) + shift), cursor) + lines[j].lstrip(" \t")
    return "\n".join(lines)


def _line_start_anchor(lines: list[str], cursor: Cursor) -> tuple[int, int] | None:
    """(index, columns) of the first non-blank of ``lines``, put at the cursor, that starts a line of the document
    (the first one only when nothing but indentation precedes the cursor on its line)."""
    for i, line in enumerate(lines):
        if line.strip() and (i > 0 or not cursor.line_before.strip()):
            return i, columns((cursor.line_before if i == 0 else "") + line, cursor.unit)
    return None


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
        scopes = enclosing_scopes(cursor, level + 1) if language.scope else []
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
    scopes = enclosing_scopes(cursor, columns(anchor, unit) + 1) if language.scope else []
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
