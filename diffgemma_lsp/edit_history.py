"""The recent edits of each open document, as unified-diff hunks, for the prompt (issue 29, its first part).

What the leading next-edit and completion systems give their models besides the code: the last few edits as diffs
(Copilot's next edit suggestions: up to 25 diffs; Zed's Zeta: ``--- a/ +++ b/`` events; Sweep: 15 blocks). Here
each document's changes arrive as line replacements (``LineDocument.on_replace``). Changes while the user types at
one place make one hunk (a burst): a change that touches or adjoins the burst's lines joins it, one elsewhere or
after a pause of ``BURST_GAP_S`` closes it. A burst that ends where it started (typed, then deleted) leaves
nothing, and a hunk that reverses the last one (an undo) removes it instead of adding a second: undo is not a new
intent. Bounded: ``MAX_HUNKS`` per document, ``MAX_HUNK_CHARS`` per hunk; a closed document's history is dropped.

Only closed hunks reach the prompt: the burst being typed is in the code itself, and leaving it out keeps the
prompt's head (where the history sits, before the current file) the same from one keystroke to the next, so that
the engine's prefix cache keeps it. Pure: no LSP, no I/O.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable, Sequence

import attrs

BURST_GAP_S = 2.0
"""A pause this long ends a burst of typing: its hunk is closed."""
MAX_HUNKS = 16
"""Closed hunks kept per document, newest last."""
MAX_HUNK_CHARS = 2000
"""A hunk's diff is cut to about this many characters (a large paste or deletion is shown by its start)."""


@attrs.frozen
class Hunk:
    """One closed edit: ``old`` lines replaced by ``new`` at ``start`` (0-based, in the document as it was then)."""

    uri: str
    start: int
    old: tuple[str, ...]
    new: tuple[str, ...]
    closed_at: float

    def diff(self) -> str:
        """The hunk in unified-diff form (``@@ -a,b +c,d @@``, then ``-`` and ``+`` lines), cut to about
        ``MAX_HUNK_CHARS``."""
        header = f"@@ -{self.start + 1},{len(self.old)} +{self.start + 1},{len(self.new)} @@\n"
        body = [f"-{_content(line)}\n" for line in self.old] + [f"+{_content(line)}\n" for line in self.new]
        text, used = [header], len(header)
        for index, line in enumerate(body):
            if used + len(line) > MAX_HUNK_CHARS:
                text.append(f"... ({len(body) - index} more lines)\n")
                break
            text.append(line)
            used += len(line)
        return "".join(text)


def _content(line: str) -> str:
    return line.rstrip("\r\n")


@attrs.define
class _Burst:
    """The hunk being typed: ``old`` stands where the document's lines ``start`` to ``end`` (exclusive) are now."""

    start: int
    end: int
    old: list[str]
    last_change: float


class DocumentEdits:
    """One document's closed hunks and its burst."""

    def __init__(self, uri: str) -> None:
        self.uri = uri
        self.hunks: collections.deque[Hunk] = collections.deque(maxlen=MAX_HUNKS)
        self.burst: _Burst | None = None

    def replaced(self, first: int, old: Sequence[str], new: Sequence[str], before: Sequence[str], now: float) -> None:
        """Lines ``first`` to ``first + len(old)`` (the list ``old``) of ``before``, the document before the
        change, became ``new``."""
        last = first + len(old)
        burst = self.burst
        if burst is not None and (now - burst.last_change >= BURST_GAP_S or first > burst.end or last < burst.start):
            self._close(before, now)
            burst = None
        if burst is None:
            self.burst = _Burst(start=first, end=first + len(new), old=list(old), last_change=now)
            return
        # one burst: the lines the change spans beyond the burst were unchanged until now, so they are in ``old``
        start, end = min(burst.start, first), max(burst.end, last)
        burst.old = (
            list(old[: max(0, burst.start - first)]) + burst.old + list(old[len(old) - max(0, last - burst.end) :])
        )
        burst.start, burst.end = start, end + len(new) - len(old)
        burst.last_change = now

    def closed(self, lines: Sequence[str], now: float) -> list[Hunk]:
        """The closed hunks, oldest first; a burst paused for ``BURST_GAP_S`` is closed first (``lines``: the
        document now)."""
        if self.burst is not None and now - self.burst.last_change >= BURST_GAP_S:
            self._close(lines, now)
        return list(self.hunks)

    def _close(self, lines: Sequence[str], now: float) -> None:
        burst, self.burst = self.burst, None
        assert burst is not None
        new = tuple(lines[burst.start : burst.end])
        old = tuple(burst.old)
        if new == old:
            return  # typed, then taken back
        if (
            self.hunks
            and (previous := self.hunks[-1]).start == burst.start
            and (previous.new, previous.old)
            == (
                old,
                new,
            )
        ):
            self.hunks.pop()  # an undo of the last edit: not a new intent
            return
        self.hunks.append(Hunk(uri=self.uri, start=burst.start, old=old, new=new, closed_at=now))


class EditHistory:
    """Every open document's ``DocumentEdits``."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._documents: dict[str, DocumentEdits] = {}

    def replaced(self, uri: str, first: int, old: Sequence[str], new: Sequence[str], before: Sequence[str]) -> None:
        """A change of ``uri`` (``LineDocument.on_replace``): its lines ``old`` at ``first`` became ``new``."""
        document = self._documents.setdefault(uri, DocumentEdits(uri))
        document.replaced(first, old, new, before, self.clock())

    def edited(self, uri: str) -> bool:
        """Whether ``uri`` was edited since it was opened: a hunk kept, or a burst being typed (undone edits left
        nothing)."""
        document = self._documents.get(uri)
        return document is not None and (bool(document.hunks) or document.burst is not None)

    def last_edit(self, uri: str, lines: Sequence[str]) -> Hunk | None:
        """The newest edit of ``uri`` (``lines``: the document now): the burst being typed, as a hunk of what it
        spans now, else the last closed hunk; None when there is none."""
        document = self._documents.get(uri)
        if document is None:
            return None
        burst = document.burst
        if burst is not None:
            new = tuple(lines[burst.start : burst.end])
            return Hunk(uri=uri, start=burst.start, old=tuple(burst.old), new=new, closed_at=self.clock())
        return document.hunks[-1] if document.hunks else None

    def forget(self, uri: str) -> None:
        """A closed document: its history goes."""
        self._documents.pop(uri, None)

    def recent(self, lines_of: Callable[[str], Sequence[str] | None], budget_chars: int) -> list[Hunk]:
        """The newest closed hunks of every document that fit ``budget_chars`` (as diffs), oldest first: a stable
        order, so that a new hunk adds to the end of what the prompt held. ``lines_of`` reads a document."""
        now = self.clock()
        hunks: list[Hunk] = []
        for uri, document in list(self._documents.items()):
            lines = lines_of(uri)
            if lines is not None:
                hunks += document.closed(lines, now)
        hunks.sort(key=lambda hunk: hunk.closed_at)
        chosen: list[Hunk] = []
        used = 0
        for hunk in reversed(hunks):
            size = len(hunk.diff())
            if used + size > budget_chars:
                break
            chosen.append(hunk)
            used += size
        return chosen[::-1]


def render(hunks: Sequence[Hunk], name_of: Callable[[str], str]) -> str:
    """Hunks as one unified diff: a ``--- a/NAME`` / ``+++ b/NAME`` header whenever the file changes."""
    parts: list[str] = []
    current = None
    for hunk in hunks:
        if hunk.uri != current:
            current = hunk.uri
            name = name_of(hunk.uri)
            parts.append(f"--- a/{name}\n+++ b/{name}\n")
        parts.append(hunk.diff())
    return "".join(parts)
