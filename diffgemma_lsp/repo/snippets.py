"""Code like the code before the cursor, found elsewhere in the workspace: each file cut into overlapping windows of
lines, each window a set of identifiers, ranked by how many it shares with the lines before the cursor (Jaccard
similarity over an inverted index, as RepoCoder and Copilot's neighbouring-tab snippets do)."""

from __future__ import annotations

import array
import collections
import re
import sys
from collections.abc import Iterable, Sequence

import attrs

WINDOW_LINES = 16
"""Lines per window, and lines before the cursor that the query is made of."""
WINDOW_STRIDE = 8
MAX_WINDOWS = 40_000
"""Windows kept in all (about 320,000 lines of code); files indexed after that have none."""
COMMON_SHARE = 0.05
"""An identifier in more than this share of the windows (``self``, ``return``) says nothing about similarity."""
MIN_SCORE = 0.2
"""Windows less similar than this are not worth their place in the prompt."""
MIN_QUERY_TOKENS = 5
"""Fewer identifiers before the cursor (the start of a file) match anything a little."""
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]+")


@attrs.frozen
class Window:
    """Lines ``start`` to ``start + WINDOW_LINES`` of a file, as the identifiers they hold."""

    start: int
    tokens: frozenset[str]


@attrs.frozen
class Snippet:
    path: str
    start: int
    """First line (0-based)."""
    score: float


def tokens_of(lines: Sequence[str]) -> frozenset[str]:
    """The identifiers of ``lines``."""
    return frozenset(token for line in lines for token in _IDENTIFIER.findall(line))


def windows_of(lines: Sequence[str]) -> list[Window]:
    """The windows of one file (the last one ends with the file)."""
    starts = list(range(0, max(len(lines) - WINDOW_LINES, 0) + 1, WINDOW_STRIDE))
    if lines and starts[-1] + WINDOW_LINES < len(lines):
        starts.append(len(lines) - WINDOW_LINES)
    windows = [Window(start, tokens_of(lines[start : start + WINDOW_LINES])) for start in starts]
    return [window for window in windows if window.tokens]


class SnippetIndex:
    """Per identifier, the windows that hold it (an array of window ids: 8 bytes an entry, the identifier stored
    once), and per window its file, first line and size. A removed file's windows leave dead ids in the arrays,
    skipped when read and dropped once they outnumber the live ones. Not thread-safe: the workspace index guards
    it."""

    def __init__(self, max_windows: int = MAX_WINDOWS) -> None:
        self.max_windows = max_windows
        self._windows: dict[int, tuple[str, int, int]] = {}
        """id -> (path, first line, identifiers)."""
        self._of_file: dict[str, list[int]] = {}
        self._postings: dict[str, array.array[int]] = {}
        self._dead = 0
        self._next_id = 0

    def __len__(self) -> int:
        return len(self._windows)

    def replace(self, path: str, windows: Sequence[Window]) -> int:
        """The windows of ``path`` are now ``windows`` (as many as the bound leaves room for); how many.

        A file indexed anew (an edited one, every few seconds while the user types) has the dead ids of its old
        windows dropped at once from its identifiers' arrays: left there, they would soon make its identifiers
        look common (more than ``COMMON_SHARE`` of the windows), and the file never similar to anything."""
        indexed_before = path in self._of_file
        self.remove(path)
        room = max(self.max_windows - len(self._windows), 0)
        ids = []
        for window in windows[:room]:
            window_id, self._next_id = self._next_id, self._next_id + 1
            self._windows[window_id] = (path, window.start, len(window.tokens))
            for token in window.tokens:
                postings = self._postings.get(token)
                if postings is None:
                    postings = self._postings[sys.intern(token)] = array.array("q")
                postings.append(window_id)
            ids.append(window_id)
        if ids:
            self._of_file[path] = ids
        if indexed_before:
            self._drop_dead({token for window in windows[:room] for token in window.tokens})
        return len(ids)

    def remove(self, path: str) -> None:
        for window_id in self._of_file.pop(path, []):
            del self._windows[window_id]
            self._dead += 1
        if self._dead > max(len(self._windows), 1_000):  # an identifier's array at most twice its live windows
            self._compact()

    def _compact(self) -> None:
        self._drop_dead(list(self._postings))
        self._dead = 0

    def _drop_dead(self, tokens: Iterable[str]) -> None:
        """Keep only live window ids in these identifiers' arrays."""
        live = self._windows
        for token in tokens:
            postings = self._postings.get(token)
            if postings is None:
                continue
            kept = array.array("q", (window_id for window_id in postings if window_id in live))
            if kept:
                self._postings[token] = kept
            else:
                del self._postings[token]

    def similar(self, query: frozenset[str], exclude_path: str, count: int) -> list[Snippet]:
        """The ``count`` windows of other files most like ``query``, best first, at most one per file, each at
        least ``MIN_SCORE`` similar."""
        if len(query) < MIN_QUERY_TOKENS:
            return []
        common = max(20, int(COMMON_SHARE * len(self._windows)))
        shared: collections.Counter[int] = collections.Counter()
        for token in query:
            postings = self._postings.get(token)
            if postings is not None and len(postings) <= common:
                shared.update(postings)
        best: dict[str, Snippet] = {}
        for window_id, overlap in shared.items():
            window = self._windows.get(window_id)
            if window is None or window[0] == exclude_path:
                continue
            path, start, size = window
            score = overlap / (len(query) + size - overlap)
            if score >= MIN_SCORE and (path not in best or score > best[path].score):
                best[path] = Snippet(path, start, score)
        return sorted(best.values(), key=lambda snippet: (-snippet.score, snippet.path, snippet.start))[:count]
