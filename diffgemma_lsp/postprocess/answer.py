"""Turn an instruction-tuned model's answer into the text to insert at the cursor. Pure: stdlib only.

An instruction-tuned checkpoint (the released DiffusionGemma-IT, prompted by the chat layout of
``engine/shared/prompt.py``) sees the code with :data:`CURSOR_MARK` at the cursor and is asked for only the missing
code. It often answers in other shapes, which :func:`unwrap_answer` undoes, in this order:

1. :func:`strip_fence`: a Markdown code fence around the code, with a sentence before it or an explanation
   after it: only the body of the first fenced block is kept.
2. :func:`remove_marker`: the cursor marker, echoed with the code around it, and the echo of the code after
   the cursor that follows it. Where the user's code holds the string ``<CURSOR>`` itself (as this project's
   does), only the marker the model echoed goes, where its answer meets the code around the cursor; the others
   are text.
3. :func:`strip_prefix_echo`: a repeat of the prefix's last lines, or of the cursor's line up to the cursor,
   at the start of the answer (models like to answer with the whole statement, or the whole function).

A repeat of the code after the cursor and indentation that does not fit are left to the filters of
:mod:`diffgemma_lsp.postprocess`, which handle them for every model. Line breaks are kept as the answer has them.

A rewrite's answer (:func:`unwrap_replacement`) goes through the same steps, with :func:`remove_wrapping` in
place of step 2: its prompt marks the selection with ``<SELECTION>`` and ``</SELECTION>`` and has no cursor marker,
and a marker the user's selection holds is kept.
"""

from __future__ import annotations

import re

from diffgemma_engine.shared.prompt import (  # the markers the chat prompt writes (a pure module, no torch)
    CURSOR_MARK,
    SELECTION_CLOSE,
    SELECTION_OPEN,
)

_BREAK = re.compile(r"(\r\n|\r|\n)")
_FENCE = re.compile(r" {0,3}(?P<fence>`{3,}|~{3,})(?P<info>.*)")
"""A fence line: up to three spaces (as in CommonMark, so that an indented fence inside code is not one), three
or more backticks or tildes, and an info string such as a language tag."""
_GENERIC = re.compile(r"\W*\w*\W*")
"""A line with at most one word, such as ``}``, ``});``, ``end`` or ``else:``."""

Line = tuple[str, str]
"""A line's text and the line break that ends it ("" for the last line)."""


def unwrap_answer(text: str, prefix: str, suffix: str) -> str:
    """The text to insert for the model's answer ``text`` at the cursor between ``prefix`` and ``suffix``.

    ``suffix`` is only compared with what follows an echoed cursor marker: the post-processing filters cut other
    repeats of it. "" means nothing to insert.
    """
    return strip_prefix_echo(remove_marker(strip_fence(text), prefix, suffix), prefix)


def unwrap_replacement(text: str, prefix: str, selection: str, suffix: str) -> str:
    """The text to put in place of ``selection`` (between ``prefix`` and ``suffix``) for the model's answer
    ``text``: as :func:`unwrap_answer`, with the selection's markers removed where the model echoed them."""
    return strip_prefix_echo(remove_wrapping(strip_fence(text), prefix, selection, suffix), prefix)


# --- 1. code fence ------------------------------------------------------------------------------------------


def strip_fence(text: str) -> str:
    """The body of the first fenced code block in ``text``, or ``text`` itself if it has no fence.

    The line break after the opening fence and the one before the closing fence go with the fences. A fence that
    is never closed (the canvas ran out) keeps everything after its opening line.
    """
    lines = _split(text)
    start = next((i for i, (line, _) in enumerate(lines) if _opening_fence(line) is not None), None)
    if start is None:
        return text
    fence = _opening_fence(lines[start][0])
    assert fence is not None
    end = next((j for j in range(start + 1, len(lines)) if _closes(lines[j][0], fence)), None)
    if end is None:
        return _join(lines[start + 1 :])
    body = lines[start + 1 : end]
    return _join([*body[:-1], (body[-1][0], "")]) if body else ""


def _opening_fence(line: str) -> str | None:
    """The fence characters that ``line`` opens a code block with, or None if it opens none."""
    match = _FENCE.fullmatch(line)
    if match is None or (match["fence"][0] == "`" and "`" in match["info"]):
        return None  # backticks in the info string: inline code, not a fence
    return match["fence"]


def _closes(line: str, fence: str) -> bool:
    """Whether ``line`` closes a block opened with ``fence``: the same character, at least as many, nothing else."""
    match = _FENCE.fullmatch(line)
    if match is None or match["info"].strip(" \t"):
        return False
    return match["fence"][0] == fence[0] and len(match["fence"]) >= len(fence)


# --- 2. cursor marker ---------------------------------------------------------------------------------------


def remove_marker(text: str, prefix: str, suffix: str) -> str:
    """``text`` without the cursor marker the model echoed, and without what follows it when that only repeats
    ``suffix``.

    A model that echoes the code around the cursor writes its own text before or after the marker; what comes
    after it may also be the code after the cursor, copied, which is not for inserting. The code echoed before
    the marker is left to :func:`strip_prefix_echo`.

    Where the code around the cursor holds no marker, every marker in the answer is the model's, and goes. Where
    it does (this project's own prompt code), only the echoed one goes: the first that only (an echo of) the end of
    ``prefix`` precedes, or that only (an echo of) the start of ``suffix`` follows, whitespace aside, unless the
    code itself holds a marker there (``prefix`` ending, or ``suffix`` starting, with it). The others are text.
    """
    if CURSOR_MARK not in prefix + suffix:  # every marker in the answer is the model's
        head, mark, tail = text.partition(CURSOR_MARK)
        tail = tail.replace(CURSOR_MARK, "")
        return head if mark and _repeats_start(tail, suffix) else head + tail
    for at in _occurrences(text, CURSOR_MARK):
        head, tail = text[:at], text[at + len(CURSOR_MARK) :]
        repeats = _repeats_start(tail, suffix)
        echoed = repeats or _echoes_end(head, prefix)
        if echoed and not (_echoes_end(head + CURSOR_MARK, prefix) or _echoes_start(CURSOR_MARK + tail, suffix)):
            return head if repeats else head + tail
    return text


def remove_wrapping(text: str, prefix: str, selection: str, suffix: str) -> str:
    """``text`` without the markers the model added to its rewrite of ``selection``.

    A marker the code it was shown (``prefix``, ``selection``, ``suffix``) never holds is the model's wherever it
    is, and goes (``<CURSOR>`` too, which a rewrite's prompt does not hold). Where the code holds one, only the
    selection's markers the model echoed around its answer go, each only where the answer holds more of that
    marker than ``selection`` does (else they are all the user's text): the first ``SELECTION_OPEN`` that only (an
    echo of) the end of ``prefix`` precedes, and the last ``SELECTION_CLOSE`` that only (an echo of) the start of
    ``suffix`` follows, whitespace aside."""
    code = prefix + selection + suffix
    for mark in (SELECTION_OPEN, SELECTION_CLOSE, CURSOR_MARK):
        if mark not in code:  # every one in the answer is the model's
            text = text.replace(mark, "")
    if text.count(SELECTION_OPEN) > selection.count(SELECTION_OPEN):
        opening = (at for at in _occurrences(text, SELECTION_OPEN) if _echoes_end(text[:at], prefix))
        if (at := next(opening, None)) is not None:
            text = text[:at] + text[at + len(SELECTION_OPEN) :]
    if text.count(SELECTION_CLOSE) > selection.count(SELECTION_CLOSE):
        ends = [
            at for at in _occurrences(text, SELECTION_CLOSE) if _echoes_start(text[at + len(SELECTION_CLOSE) :], suffix)
        ]
        if ends:
            text = text[: ends[-1]] + text[ends[-1] + len(SELECTION_CLOSE) :]
    return text


def _occurrences(text: str, mark: str) -> list[int]:
    """Where ``mark`` starts in ``text``, in order."""
    found, at = [], text.find(mark)
    while at >= 0:
        found.append(at)
        at = text.find(mark, at + len(mark))
    return found


def _squash(text: str) -> str:
    """``text`` with each run of whitespace one space, and none at the ends: how an echo compares with code."""
    return " ".join(text.split())


def _echoes_end(text: str, code: str) -> bool:
    """Whether ``text`` is, whitespace aside, nothing or the end of ``code``."""
    return _squash(code).endswith(_squash(text))


def _echoes_start(text: str, code: str) -> bool:
    """Whether ``text`` is, whitespace aside, nothing or the start of ``code``."""
    return _squash(code).startswith(_squash(text))


def _repeats_start(text: str, suffix: str) -> bool:
    """Whether ``text`` is the start of ``suffix``, line by line without the indentation and trailing whitespace
    (the last line may stop short)."""
    ours = [line.strip() for line, _ in _split(text)]
    while ours and not ours[-1]:
        ours.pop()
    theirs = [line.strip() for line, _ in _split(suffix)]
    if len(ours) > len(theirs):
        return False
    if not ours:
        return True
    return ours[:-1] == theirs[: len(ours) - 1] and theirs[len(ours) - 1].startswith(ours[-1])


# --- 3. repeat of the prefix --------------------------------------------------------------------------------


def strip_prefix_echo(text: str, prefix: str) -> str:
    """``text`` without the longest repeat, at its start, of the prefix's last lines (the last one partial).

    The prefix's last line is the cursor's line up to the cursor: the answer's corresponding line must start
    with all of it. The lines before it must be repeated whole. Lines compare without trailing whitespace, the
    first non-blank one without leading whitespace too, unless it has at most one word (a lone ``}`` or ``end``
    repeats nothing reliably); the lines after it must be re-indented the same way, and what follows the repeat
    gets that re-indentation undone. A repeat of blank lines only is not stripped.
    """
    before = prefix.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    lines = _split(text)
    for k in range(min(len(before), len(lines)), 0, -1):
        rest = _after_repeat(lines, before[-k:])
        if rest is not None:
            return rest
    return text


def _after_repeat(lines: list[Line], repeated: list[str]) -> str | None:
    """What follows ``repeated`` (prefix lines, the last one partial) at the start of ``lines``, or None."""
    if not any(line.strip() for line in repeated):
        return None
    *whole, typed = repeated
    shift: tuple[str, str] | None = None  # (the answer's indentation, the prefix's) of the first non-blank line
    for (line, _), original in zip(lines, whole, strict=False):
        if not original.strip() or not line.strip():
            if line.strip() or original.strip():
                return None
        elif shift is None:
            if line.strip() != original.strip():
                return None
            shift = (_indentation(line), _indentation(original))
            if _GENERIC.fullmatch(original.strip()) and shift[0] != shift[1]:
                return None
        elif _reindent(line, shift).rstrip() != original.rstrip():
            return None
    cursor_line, end = lines[len(whole)]
    after = lines[len(whole) + 1 :]
    if shift is None:  # the cursor's line is the first with content: only it is compared
        first = _after_typed(cursor_line.lstrip(" \t"), typed.lstrip(" \t"))
        return None if first is None else first + end + _join(after)
    cursor_line = _reindent(cursor_line, shift)
    if typed.strip():
        first = _after_typed(cursor_line, typed)
    else:  # only indentation typed: the answer's own, if different, is for fit_indentation to judge
        first = cursor_line[len(typed) :] if cursor_line.startswith(typed) else cursor_line
    if first is None:
        return None
    return _join([(first, end), *((_reindent(line, shift), brk) for line, brk in after)])


def _after_typed(line: str, typed: str) -> str | None:
    """The rest of ``line`` after the part of the cursor's line before the cursor, if it starts with that part.

    When that part ends with whitespace, the line may have other whitespace there or none, if what follows is
    not a word character (``return(x)`` after ``return ``): that is what the model meant by the same line.
    """
    if line.startswith(typed):
        return line[len(typed) :]
    stem = typed.rstrip(" \t")
    if not stem or stem == typed or not line.startswith(stem):
        return None
    rest = line[len(stem) :]
    if rest[:1].isalnum() or rest[:1] == "_":
        return None
    return rest.lstrip(" \t")


def _indentation(line: str) -> str:
    return line[: len(line) - len(line.lstrip(" \t"))]


def _reindent(line: str, shift: tuple[str, str]) -> str:
    """``line`` with the answer's indentation ``shift[0]`` at its start turned into the prefix's ``shift[1]``."""
    ours, theirs = shift
    if ours == theirs or not line.strip() or not line.startswith(ours):
        return line
    return theirs + line[len(ours) :]


# --- lines --------------------------------------------------------------------------------------------------


def _split(text: str) -> list[Line]:
    """``text``'s lines with their line breaks (CRLF, LF or CR); joined again they give ``text``."""
    parts = _BREAK.split(text)
    return list(zip(parts[0::2], [*parts[1::2], ""], strict=True))


def _join(lines: list[Line]) -> str:
    return "".join(line + brk for line, brk in lines)
