"""Reuse a shown completion while the user types what it suggested (as Copilot and llama.vim do).

If the last completion for a document was ``text`` at some cursor, and since then the user only typed characters
that ``text`` starts with, the rest of ``text`` is still the answer: no model call needed.
"""

from __future__ import annotations

import attrs

from diffgemma_lsp.postprocess.confidence import Scored

ANCHOR_CHARS = 256
"""How much text on each side of the cursor must be unchanged for a shown completion to still apply."""


@attrs.frozen(kw_only=True)
class Shown:
    """A completion the server returned."""

    offset: int
    """Cursor offset (code points) in the document when it was computed."""
    before: str
    """The last ``ANCHOR_CHARS`` characters before that cursor."""
    after: str
    """The first ``ANCHOR_CHARS`` characters after it."""
    text: str
    confidence: tuple[float, ...] | None = None
    """The model's confidence in each character of ``text`` (None: not known)."""

    def typed(self, source: str, cursor: int) -> str | None:
        """What the user typed where this was offered, up to ``cursor`` in ``source``, if the text around it is as
        it was (``before`` still ends where it was offered, ``after`` still follows the cursor); None otherwise,
        or when the cursor is not after where it was offered."""
        if cursor <= self.offset or source[max(0, self.offset - ANCHOR_CHARS) : self.offset] != self.before:
            return None
        if source[cursor : cursor + ANCHOR_CHARS] != self.after[:ANCHOR_CHARS]:
            return None
        return source[self.offset : cursor]


class ShownCompletions:
    """The last shown completion per document."""

    def __init__(self) -> None:
        self._shown: dict[str, Shown] = {}
        self.hits = 0
        self.lookups = 0

    def remember(
        self, uri: str, source: str, offset: int, text: str, confidence: tuple[float, ...] | None = None
    ) -> None:
        """Note that ``text`` (with the model's ``confidence`` in each character, where known) was offered at
        ``offset`` of ``source``."""
        self._shown[uri] = Shown(
            offset=offset,
            before=source[max(0, offset - ANCHOR_CHARS) : offset],
            after=source[offset : offset + ANCHOR_CHARS],
            text=text,
            confidence=confidence,
        )

    def forget(self, uri: str) -> None:
        """Drop the document's entry (closed, or the user went elsewhere)."""
        self._shown.pop(uri, None)

    def showing(self, uri: str, source: str) -> bool:
        """Whether the last completion for ``uri`` is still on screen as far as the server can tell: the text around
        where it was offered is as it was (the user has neither typed nor taken it)."""
        shown = self._shown.get(uri)
        if shown is None:
            return False
        start = max(0, shown.offset - ANCHOR_CHARS)
        return source[start : shown.offset] == shown.before and source[shown.offset :].startswith(shown.after)

    def last(self, uri: str) -> Shown | None:
        """The last completion shown for ``uri`` (None: none, or forgotten)."""
        return self._shown.get(uri)

    def lookup(self, uri: str, source: str, offset: int) -> Scored | None:
        """The rest of the shown completion (with its confidences) if the user typed its start and changed nothing
        else around it."""
        self.lookups += 1
        shown = self._shown.get(uri)
        typed = shown.typed(source, offset) if shown is not None else None
        if shown is None or typed is None or not shown.text.startswith(typed) or len(typed) >= len(shown.text):
            return None
        self.hits += 1
        start = len(typed)
        return Scored(shown.text[start:], None if shown.confidence is None else shown.confidence[start:])
