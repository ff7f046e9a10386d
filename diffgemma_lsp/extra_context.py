"""Extra context from the workspace: a ring buffer of chunks of recently opened, edited and saved files.

Like llama.vim's ring buffer: the model sees pieces of the other files the user works with, placed before the
current file in the prompt. The chunks change only when another file is opened, saved or edited, never while
the user types in the current file, so the engine's encoded prefix stays valid from one keystroke to the next.
"""

from __future__ import annotations

import collections
from collections.abc import Callable

import attrs

from diffgemma_lsp.repo.privacy import secret_text

CHUNK_LINES = 64
"""Lines per chunk."""
RING_SIZE = 16
"""Chunks kept."""
CHUNK_CHARS = CHUNK_LINES * 160
"""Characters per chunk at most (a minified file's one line is cut): the ring holds at most 16 of these."""


@attrs.frozen(kw_only=True)
class Chunk:
    """Lines of one file."""

    uri: str
    name: str
    text: str
    secret: bool = False
    """The file it was taken from holds a secret (``repo.privacy.secret_text``): it is never sent."""


def file_name(uri: str) -> str:
    """The file's name, as a chunk of it is labelled in the prompt."""
    return uri.rsplit("/", 1)[-1] or uri


def chunk_around(text: str, line: int, lines: int = CHUNK_LINES) -> str:
    """``lines`` lines of ``text`` centred on ``line``, at most ``CHUNK_CHARS`` characters of them."""
    all_lines = text.splitlines(keepends=True)
    start = max(0, min(line - lines // 2, len(all_lines) - lines))
    return "".join(all_lines[start : start + lines])[:CHUNK_CHARS]


class ExtraContext:
    """The ring of chunks, most recent last; at most one chunk per file."""

    def __init__(self, size: int = RING_SIZE) -> None:
        self._ring: collections.OrderedDict[str, Chunk] = collections.OrderedDict()
        self._edited: dict[str, int] = {}
        self.size = size

    def note_edit(self, uri: str, line: int) -> None:
        """Remember that ``uri`` was edited near ``line``; its chunk is taken once the user works elsewhere."""
        self._edited[uri] = line

    def take_edits(self, current_uri: str, text_of: Callable[[str], str | None]) -> None:
        """Turn the edits of files other than ``current_uri`` into chunks (``text_of`` reads a document)."""
        for uri in [uri for uri in self._edited if uri != current_uri]:
            line = self._edited.pop(uri)
            text = text_of(uri)
            if text is not None:
                self.add(uri, text, line)

    def add(self, uri: str, text: str, line: int = 0) -> None:
        """Take (or refresh) the chunk of ``uri`` around ``line``."""
        secret = secret_text(text)
        text = chunk_around(text, line)
        if not text.strip():
            return
        chunk = Chunk(uri=uri, name=file_name(uri), text=text, secret=secret)
        if self._ring.get(uri) == chunk:
            return  # unchanged: keep the order, and with it the engine's cached prefix
        self._ring.pop(uri, None)
        self._ring[uri] = chunk
        while len(self._ring) > self.size:
            self._ring.popitem(last=False)

    def remove(self, uri: str) -> None:
        """Forget ``uri`` (deleted or renamed)."""
        self._ring.pop(uri, None)
        self._edited.pop(uri, None)

    def for_request(
        self, current_uri: str, budget_chars: int, shared: Callable[[Chunk], bool] = lambda chunk: True
    ) -> list[Chunk]:
        """The newest chunks of other files that fit ``budget_chars`` and are ``shared``, oldest first (stable prompt
        order); the first that does not fit whole gives the whole lines of its start that do (a 64-line chunk is
        larger than the default budget: without this the ring gave nothing)."""
        chosen: list[Chunk] = []
        used = 0
        for chunk in reversed(self._ring.values()):
            if chunk.uri == current_uri or not shared(chunk):
                continue
            if used + len(chunk.text) > budget_chars:
                head = _lines_within(chunk.text, budget_chars - used)
                if head:
                    chosen.append(attrs.evolve(chunk, text=head))
                break
            chosen.append(chunk)
            used += len(chunk.text)
        return chosen[::-1]


def _lines_within(text: str, budget_chars: int) -> str:
    """The whole lines at the start of ``text`` that fit ``budget_chars``."""
    cut = text.rfind("\n", 0, budget_chars + 1) if budget_chars > 0 else -1
    return text[: cut + 1] if cut >= 0 else ""
