"""The workspace index: every indexed file's definitions (by name) and code windows, built in the background from
the workspace folders and kept current as files are edited, saved, created and deleted. Bounded: at most
``max_files`` files, ``MAX_DEFINITIONS`` definitions and ``snippets.MAX_WINDOWS`` windows.

Thread-safe: the language server builds it on a worker thread while its event loop reads it. A file is parsed
outside the lock and swapped in under it.
"""

from __future__ import annotations

import collections
import functools
import logging
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import attrs

from diffgemma_lsp.grammars import OverBudget, language_of_path
from diffgemma_lsp.repo import files
from diffgemma_lsp.repo.definitions import Definition, definitions_of
from diffgemma_lsp.repo.privacy import SECRET_TEXT, Privacy, secret_text
from diffgemma_lsp.repo.snippets import WINDOW_LINES, Snippet, SnippetIndex, windows_of

logger = logging.getLogger(__name__)

MAX_FILES = 20_000
MAX_DEFINITIONS = 200_000


@attrs.frozen
class FileEntry:
    definitions: tuple[Definition, ...]
    lines: tuple[str, ...]
    """The text the windows were read from, kept for the snippets' text while the file has windows (the bound on
    windows bounds it); empty otherwise."""


@attrs.frozen
class BuildReport:
    files: int
    definitions: int
    windows: int
    seconds: float


class WorkspaceIndex:
    """Definitions and windows of the workspace's files, by absolute path."""

    def __init__(self, max_files: int = MAX_FILES, privacy: Privacy | None = None) -> None:
        self.max_files = max_files
        self.privacy = privacy or Privacy()
        """What the user would not share: never read (its workspace folders are the index's)."""
        self.left_out: list[files.LeftOut] = []
        """What the builds left out, and why (at most ``files.MAX_LEFT_OUT`` a build)."""
        self.roots: list[Path] = []
        self._lock = threading.Lock()
        self._files: dict[str, FileEntry] = {}
        self._by_name: dict[str, dict[str, list[Definition]]] = collections.defaultdict(dict)
        """name -> path -> the file's definitions of that name."""
        self._definitions = 0
        self._snippets = SnippetIndex()
        self.version = 0
        """Counts the changes to what is indexed (a file indexed anew or removed): what was read before a change
        may be cached until the next one."""
        self._relative: dict[tuple[str, int], str] = {}
        self.files_version = 0
        """Counts the changes to which files are indexed (what an import can resolve to)."""

    # -- building ---------------------------------------------------------------------------------------------

    def build(
        self,
        roots: Sequence[Path],
        stop: Callable[[], bool] = lambda: False,
        progress: Callable[[int, int], None] | None = None,
    ) -> BuildReport:
        """Index every file of ``roots`` (their folders' files a grammar reads), stopping early when ``stop()``
        says so; files indexed already (an open document's text) are not read again. The folders are walked
        first, then ``progress(done, found)`` follows the files read, after each one."""
        started = time.perf_counter()
        for root in roots:
            if root not in self.roots:
                self.roots.append(root)
        self.privacy.add_roots(roots)
        left_out: list[files.LeftOut] = []
        self.left_out = left_out
        walked_with = self.privacy.patterns_version

        def still_shared(path: str) -> bool:
            """Asked under the lock: the ``privateFiles`` setting may have changed since the walk (an editor that
            sends its settings after ``initialized``), and :meth:`set_private_patterns` swept the index then."""
            return self.privacy.patterns_version == walked_with or self.privacy.secret(path) is None

        found = [path for root in roots for path in files.workspace_files(root, self.max_files, self.privacy, left_out)]
        for done, path in enumerate(found, 1):
            if stop() or len(self._files) >= self.max_files:
                break
            if str(path) not in self._files:
                text = files.read_source(path)
                if text is not None and secret_text(text):
                    left_out.append(files.LeftOut(str(path), SECRET_TEXT))
                elif text is not None:
                    self.index_text(str(path), text, current=functools.partial(still_shared, str(path)))
            if progress is not None:
                progress(done, len(found))
        return self.report(started)

    def report(self, started: float | None = None) -> BuildReport:
        """What is indexed; ``seconds`` since ``started`` (a ``time.perf_counter()``), 0 without it."""
        seconds = time.perf_counter() - started if started is not None else 0.0
        with self._lock:
            return BuildReport(len(self._files), self._definitions, len(self._snippets), seconds)

    def index_text(
        self, path: str, text: str, language_id: str | None = None, current: Callable[[], bool] = lambda: True
    ) -> None:
        """(Re)index ``path`` from ``text`` (an open document's, which may differ from the disk's). Text past
        ``files.MAX_FILE_BYTES`` is skipped as the walk skips such files (an open 5 MB document took 15 s of the
        server's time to parse and window), and an earlier version of it is dropped. Nothing is changed unless
        ``current()`` (asked under the lock, when the text is parsed) says this text is still the file's."""
        language_id = language_id or language_of_path(path)
        if language_id is None:
            return
        if len(text) > files.MAX_FILE_BYTES:  # characters: at least as many bytes
            self.remove(path)
            return
        try:
            definitions = tuple(definitions_of(text, language_id, path))
        except OverBudget as exc:
            logger.info("not indexed: %s: %s", path, exc)
            return
        except Exception:  # a grammar failing on one file must not stop the index
            logger.warning("could not index %s", path, exc_info=True)
            return
        lines = tuple(text.splitlines())
        windows = windows_of(lines)
        with self._lock:
            if not current():
                return  # a later change of the file (its document closed, the file deleted) was made meanwhile
            if path not in self._files and len(self._files) >= self.max_files:
                return
            if path not in self._files:
                self.files_version += 1
            self._remove(path)
            self.version += 1
            room = max(MAX_DEFINITIONS - self._definitions, 0)
            definitions = definitions[:room]
            kept = self._snippets.replace(path, windows)
            self._files[path] = FileEntry(definitions, lines if kept else ())
            self._definitions += len(definitions)
            for definition in definitions:
                self._by_name[definition.name].setdefault(path, []).append(definition)

    def remove(self, path: str, current: Callable[[], bool] = lambda: True) -> None:
        """Forget ``path`` (deleted), while ``current()`` (see :meth:`index_text`)."""
        with self._lock:
            if current():
                self._remove(path)

    def set_private_patterns(self, patterns: Sequence[str]) -> None:
        """The ``privateFiles`` setting changed: the indexed files it now names leave the index at once (a file it
        no longer names comes back when it is read again)."""
        if not self.privacy.set_patterns(patterns):
            return
        with self._lock:
            for path in [path for path in self._files if self.privacy.secret(path) is not None]:
                self._remove(path)

    def remove_under(self, root: Path) -> None:
        """Forget every file under ``root`` (a workspace folder removed)."""
        with self._lock:
            for path in [path for path in self._files if Path(path).is_relative_to(root)]:
                self._remove(path)
            self.roots = [known for known in self.roots if known != root]

    def _remove(self, path: str) -> None:
        entry = self._files.pop(path, None)
        if entry is None:
            return
        self.version += 1
        self.files_version += 1
        self._definitions -= len(entry.definitions)
        for definition in entry.definitions:
            paths = self._by_name.get(definition.name)
            if paths is not None:
                paths.pop(path, None)
                if not paths:
                    del self._by_name[definition.name]
        self._snippets.remove(path)

    # -- reading ----------------------------------------------------------------------------------------------

    def __contains__(self, path: str) -> bool:
        return path in self._files

    def definitions_named(self, name: str) -> list[Definition]:
        """Every indexed definition of ``name``, by path."""
        with self._lock:
            paths = self._by_name.get(name)
            return [definition for path in sorted(paths) for definition in paths[path]] if paths else []

    def definitions_in(self, path: str) -> tuple[Definition, ...]:
        with self._lock:
            entry = self._files.get(path)
            return entry.definitions if entry is not None else ()

    def similar(self, query: frozenset[str], exclude_path: str, count: int) -> list[tuple[Snippet, list[str]]]:
        """Windows of other files whose identifiers are like ``query``, best first, each with its lines."""
        with self._lock:
            found = self._snippets.similar(query, exclude_path, count)
            return [(snippet, self._window_lines(snippet)) for snippet in found]

    def _window_lines(self, snippet: Snippet) -> list[str]:
        return list(self._files[snippet.path].lines[snippet.start : snippet.start + WINDOW_LINES])

    def relative(self, path: str) -> str:
        """``path`` as the prompt names it: relative to the workspace folder it is in, else its name."""
        key = (path, len(self.roots))
        if (known := self._relative.get(key)) is not None:
            return known
        found = Path(path).name
        for root in self.roots:
            if Path(path).is_relative_to(root):
                found = Path(path).relative_to(root).as_posix()
                break
        if len(self._relative) > 4 * MAX_FILES:
            self._relative.clear()
        self._relative[key] = found
        return found
