"""The workspace index as the language server keeps it: built on a worker thread from the workspace folders when
the client has initialized, an open document re-read from its text five seconds after the user stops typing in it
(at once when saved), a file created, changed or deleted on disk (the client's file watching) read again. No event
costs the event loop more than a dictionary update: parsing runs on worker threads."""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from pathlib import Path
from typing import TypeVar

from pygls.uris import to_fs_path

from diffgemma_lsp.grammars import GRAMMARS, language_of_path
from diffgemma_lsp.repo import files
from diffgemma_lsp.repo.assembly import ContextChunk, RepoContext
from diffgemma_lsp.repo.index import WorkspaceIndex

logger = logging.getLogger(__name__)

PROGRESS_EVERY_S = 0.25
"""How often the build's progress is reported at most (the last file always is)."""
IndexListener = Callable[[int, int, bool], None]
"""Told, on the event loop's thread, a build's files indexed, files found, and whether it has finished."""

REINDEX_DELAY_S = 5.0
"""How long after its last change an open document is parsed again (at once when saved). Its own definitions
matter little to its own completions (the prompt has its text) and reading a long file takes tens of milliseconds
of a worker thread that shares the interpreter with the event loop: not while the user is typing."""


@functools.lru_cache(maxsize=1024)
def path_of(uri: str) -> str | None:
    """The file a ``file:`` uri names; None for other schemes (an untitled buffer). Cached: asked on every
    keystroke, and parsing the uri was a fifth of the language server's time per ``didChange``."""
    if not uri.startswith("file:"):
        return None
    path = to_fs_path(uri)
    return str(Path(path)) if path else None


class LiveIndex:
    """The index, its context assembly, and the work that keeps them current."""

    def __init__(self, index: WorkspaceIndex | None = None) -> None:
        self.index = index or WorkspaceIndex()
        self.context = RepoContext(self.index)
        self._pending: dict[str, asyncio.TimerHandle] = {}
        self._writes: dict[str, int] = {}
        """Per path, the number of the latest change of its entry sent to a worker thread: an earlier one that ends
        later (a document opened and closed in a burst: its text indexed after the close) changes nothing."""
        self._numbers = itertools.count()
        self._tasks: set[asyncio.Future[object]] = set()
        self._stopped = False
        self._building = 0
        self.built: asyncio.Future[object] | None = None
        """The background build, once started (tests and ``context`` wait for it)."""
        self.progress = (0, 0)
        """The last build's files indexed and files found."""
        self.on_progress: IndexListener | None = None
        """Told how a build goes (the server's ``window/workDoneProgress``)."""

    def start(self, roots: Iterable[Path]) -> None:
        """Index ``roots`` on a worker thread (once per folder)."""
        roots = [root for root in roots if root.is_dir() and root not in self.index.roots]
        if not roots:
            return
        self.index.privacy.add_roots(roots)
        self.built = self._spawn(self._build(roots))

    async def _build(self, roots: list[Path]) -> None:
        self._building += 1
        loop = asyncio.get_running_loop()
        last = [0.0]

        def progress(done: int, found: int) -> None:  # on the build's thread
            now = time.monotonic()
            if done == found or now - last[0] >= PROGRESS_EVERY_S:
                last[0] = now
                loop.call_soon_threadsafe(self._progressed, done, found, False)

        try:
            report = await _on_daemon_thread(lambda: self.index.build(roots, lambda: self._stopped, progress))
        finally:
            self._building -= 1
            self._progressed(*self.progress, True)
        logger.info(
            "workspace index: %d files, %d definitions, %d windows in %.1f s",
            report.files,
            report.definitions,
            report.windows,
            report.seconds,
        )

    def _progressed(self, done: int, found: int, finished: bool) -> None:
        self.progress = (done, found)
        if self.on_progress is not None:
            self.on_progress(done, found, finished)

    def status(self) -> dict[str, object]:
        """What is indexed, whether a build is under way and how far it got: files read of files found (for
        ``diffgemma.status``)."""
        report = self.index.report()
        return {
            "files": report.files,
            "definitions": report.definitions,
            "windows": report.windows,
            "building": self._building > 0,
            "indexed": self.progress[0],
            "found": self.progress[1],
        }

    def folders_changed(self, added: Iterable[Path], removed: Iterable[Path]) -> None:
        for root in removed:
            self.index.remove_under(root)
        self.start(added)

    def document_changed(
        self, uri: str, text_of: Callable[[], str | None], language_id: str = "", delay_s: float | None = None
    ) -> None:
        """An open document changed: parse it again once the user has paused (``delay_s``, by default
        ``REINDEX_DELAY_S``; 0 when it was saved)."""
        path = path_of(uri)
        if path is None:
            return
        loop = asyncio.get_running_loop()
        if (handle := self._pending.pop(path, None)) is not None:
            handle.cancel()

        def reindex() -> None:
            self._pending.pop(path, None)
            text = text_of()
            if text is not None:
                self._write(path, functools.partial(self._index_if_shared, path, text, _known(language_id)))

        self._pending[path] = loop.call_later(REINDEX_DELAY_S if delay_s is None else delay_s, reindex)

    def document_opened(self, uri: str, text: str, language_id: str = "") -> None:
        path = path_of(uri)
        if path is not None and (language_id in GRAMMARS or language_of_path(path)):
            self._write(path, functools.partial(self._index_if_shared, path, text, _known(language_id)))

    def _index_if_shared(
        self, path: str, text: str | None, language_id: str | None, current: Callable[[], bool]
    ) -> None:
        """Index ``path`` from ``text`` unless the user would not share it (``privacy.py``), or there is no text;
        then it is dropped. Nothing changes once ``current()`` is False."""
        reason = self.index.privacy.private(path, text) if text is not None else "no text"
        if reason is None and text is not None:
            self.index.index_text(path, text, language_id, current)
        else:
            logger.debug("workspace index: %s left out: %s", path, reason)
            self.index.remove(path, current)

    def _write(self, path: str, work: Callable[[Callable[[], bool]], None]) -> None:
        """Run ``work`` on a worker thread as the latest change of ``path``'s entry (``_writes``)."""
        number = next(self._numbers)
        self._writes[path] = number

        def current() -> bool:
            return self._writes.get(path) == number

        def done(_: object) -> None:
            if current():
                del self._writes[path]

        self._spawn(asyncio.to_thread(work, current)).add_done_callback(done)

    def document_closed(self, uri: str) -> None:
        """A closed document: the file on disk is what counts again (a file outside the workspace is dropped)."""
        path = path_of(uri)
        if path is None:
            return
        if (handle := self._pending.pop(path, None)) is not None:
            handle.cancel()
        self.context.forget(path)
        self.file_changed(uri, deleted=not Path(path).is_file())  # its text may be on its way into the index

    def file_changed(self, uri: str, deleted: bool) -> None:
        """A file changed on disk (saved, created, changed by another program, or deleted)."""
        path = path_of(uri)
        if path is None or language_of_path(path) is None:
            return
        if deleted:
            self._writes[path] = next(self._numbers)  # what is on its way for it changes nothing
            self.index.remove(path)
            self.context.forget(path)
            return

        def read_and_index(current: Callable[[], bool]) -> None:
            self._index_if_shared(path, files.read_source(Path(path)), None, current)  # None: a link or a pipe

        self._write(path, read_and_index)

    def chunks(
        self, uri: str, text: str, lines: Sequence[str], language_id: str, line: int, budget_chars: int
    ) -> list[ContextChunk]:
        """:meth:`RepoContext.chunks` for the document ``uri``."""
        return self.context.chunks(path_of(uri) or uri, text, lines, language_id, line, budget_chars)

    def cursor_chunks(
        self, uri: str, text: str, lines: Sequence[str], language_id: str, line: int, column: int, budget_chars: int
    ) -> list[ContextChunk]:
        """:meth:`RepoContext.cursor_chunks` for the document ``uri``."""
        return self.context.cursor_chunks(path_of(uri) or uri, text, lines, language_id, line, column, budget_chars)

    def stop(self) -> None:
        """Stop building (the worker checks between files) and drop the pending work."""
        self._stopped = True
        for handle in self._pending.values():
            handle.cancel()
        self._pending.clear()

    def _spawn(self, work: Awaitable[object]) -> asyncio.Future[object]:
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._done)
        return task

    def _done(self, task: asyncio.Future[object]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            logger.warning("workspace index: %s", task.exception())


def _known(language_id: str) -> str | None:
    """The document's language id where a grammar reads it, else None (the index goes by the file's extension)."""
    return language_id if language_id in GRAMMARS else None


T = TypeVar("T")


def _on_daemon_thread(work: Callable[[], T]) -> asyncio.Future[T]:
    """``work()`` on a thread of its own that does not hold the process up when it exits (a worker of
    ``asyncio.to_thread`` is joined at exit: a server whose client went away would wait for the build to end)."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()

    def settle(result: T | None, error: BaseException | None) -> None:
        if future.done():
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)  # type: ignore[arg-type]

    def run() -> None:
        try:
            result = work()
        except Exception as exc:  # noqa: BLE001 - handed to the task that awaits the build
            loop.call_soon_threadsafe(settle, None, exc)
        else:
            loop.call_soon_threadsafe(settle, result, None)

    threading.Thread(target=run, name="diffgemma-index", daemon=True).start()
    return future
