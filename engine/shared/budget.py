"""Fit the code around the cursor into a budget, cut on line boundaries at points that stay put while typing.

Pure (standard library and attrs only): the engine counts tokens with the checkpoint's tokenizer, the remote
backend counts characters, and both cut the same way.

A prompt's encoding is reused from one keystroke to the next only up to the first token that changed. Cutting
the prefix a fixed distance before the cursor moves the cut, and so the prompt's head, with every keystroke.
Here the prefix is cut at the start of a *block* of lines, blocks counted from the prefix's first line, and
the cut moves only when the kept text outgrows its budget, one block at a time; the suffix is cut at the end
of a block counted from the cursor. Between two moves, successive prompts share everything up to the cursor.
"""

from __future__ import annotations

from collections.abc import Callable

import attrs

Count = Callable[[str], int]
"""The size of a text in the budget's unit (tokens, or characters)."""

TOKENS_PER_LINE = 10
"""A typical line of code, for sizing blocks of lines from a token budget."""
CHARS_PER_LINE = 40
"""The same line in characters, for a character budget."""
BLOCKS_PER_BUDGET = 8
"""A block of lines is about this fraction of its budget: the most a cut gives up, and the typing it absorbs."""


def block_lines(budget: int, per_line: int = TOKENS_PER_LINE) -> int:
    """Lines per block for a budget: an eighth of it at ``per_line`` units a line, at least one line."""
    return max(1, budget // (per_line * BLOCKS_PER_BUDGET))


@attrs.frozen(kw_only=True)
class Cut:
    """The parts of prefix and suffix that fit."""

    prefix: str
    suffix: str
    truncated: bool


def _blocks(text: str, lines_per_block: int) -> list[str]:
    lines = text.splitlines(keepends=True)
    return ["".join(lines[i : i + lines_per_block]) for i in range(0, len(lines), lines_per_block)]


def _fitting(pieces: list[str], budget: int, count: Count, *, from_end: bool) -> str:
    """The longest run of whole pieces at the end (or the start) of ``pieces`` that fits in ``budget``."""
    ordered = pieces[::-1] if from_end else pieces
    used, taken = 0, 0
    while taken < len(ordered) and used + (size := count(ordered[taken])) <= budget:
        used += size
        taken += 1
    kept = ordered[:taken]
    return "".join(kept[::-1] if from_end else kept)


def _chars(line: str, budget: int, count: Count, *, from_end: bool) -> str:
    """The longest end (or start) of one line longer than the budget that fits, by bisection on characters."""
    low, high = 0, len(line)
    while low < high:
        middle = (low + high + 1) // 2
        if count(line[len(line) - middle :] if from_end else line[:middle]) <= budget:
            low = middle
        else:
            high = middle - 1
    return line[len(line) - low :] if from_end else line[:low]


def _cut(text: str, budget: int, count: Count, lines_per_block: int | None, *, from_end: bool) -> str:
    if budget <= 0 or not text:
        return ""
    blocks = _blocks(text, lines_per_block or block_lines(budget))
    kept = _fitting(blocks, budget, count, from_end=from_end)
    if kept:
        return kept
    # Not even the block at the cursor fits (very long lines): its whole lines nearest the cursor, else the
    # characters of the cursor's line nearest the cursor.
    lines = blocks[-1 if from_end else 0].splitlines(keepends=True)
    kept = _fitting(lines, budget, count, from_end=from_end)
    return kept or _chars(lines[-1 if from_end else 0], budget, count, from_end=from_end)


def cut_prefix(prefix: str, budget: int, count: Count, lines_per_block: int | None = None) -> str:
    """The end of ``prefix`` that fits in ``budget``: whole blocks of lines (counted from the prefix's start),
    else whole lines, else characters."""
    return _cut(prefix, budget, count, lines_per_block, from_end=True)


def cut_suffix(suffix: str, budget: int, count: Count, lines_per_block: int | None = None) -> str:
    """The start of ``suffix`` that fits in ``budget``: whole blocks of lines (counted from the cursor), else
    whole lines, else characters."""
    return _cut(suffix, budget, count, lines_per_block, from_end=False)


def fit(prefix: str, suffix: str, budget: int, count: Count, per_line: int = TOKENS_PER_LINE) -> Cut:
    """Prefix and suffix within ``budget`` together: three quarters for the prefix, a quarter for the suffix, and
    the room one of them leaves unused goes to the other.

    Sizes are sums over blocks (``count`` may remember them: only the block at the cursor changes while typing),
    so they can differ by a token or two from encoding the whole text at once; the caller trims that.
    """
    lines_per_block = block_lines(budget, per_line)

    def size(text: str) -> int:
        return sum(map(count, _blocks(text, lines_per_block)))

    prefix_size, suffix_size = size(prefix), size(suffix)
    if prefix_size + suffix_size <= budget:
        return Cut(prefix=prefix, suffix=suffix, truncated=False)
    suffix_share = budget // 4
    if suffix_size <= suffix_share:
        kept_suffix = suffix
    elif prefix_size <= budget - suffix_share:
        kept_suffix = cut_suffix(suffix, budget - prefix_size, count, lines_per_block)
    else:
        kept_suffix = cut_suffix(suffix, suffix_share, count, lines_per_block)
    kept_prefix = cut_prefix(prefix, budget - size(kept_suffix), count, lines_per_block)
    return Cut(prefix=kept_prefix, suffix=kept_suffix, truncated=True)
