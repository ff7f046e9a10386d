"""The workspace index's build as ``window/workDoneProgress``: "Indexing the workspace", files indexed of files
found, ended with what was indexed. Until it ends, completions have less repository context than they will: the
progress says so, and ``diffgemma.status`` (its ``workspaceIndex``) tells the same to whoever asks."""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Callable

from lsprotocol import types
from pygls.lsp.server import LanguageServer

logger = logging.getLogger(__name__)

TITLE = "Indexing the workspace"


class IndexProgress:
    """One progress per build, for a client that takes server-initiated progress (``supported``)."""

    def __init__(self, server: LanguageServer, supported: Callable[[], bool]) -> None:
        self.server = server
        self.supported = supported
        self._token: str | None = None
        self._starting: asyncio.Future[None] | None = None
        self._latest = (0, 0)
        self._finished = False

    def __call__(self, done: int, found: int, finished: bool) -> None:
        """A build's files indexed of files found; ``finished`` once it has ended."""
        self._latest = (done, found)
        self._finished = self._finished or finished
        if self._starting is None:
            if finished or not self.supported():
                self._reset()
                return
            self._starting = asyncio.ensure_future(self._begin())
        elif self._token is not None and self._finished:
            self._end()
        elif self._token is not None:
            self._report()
        elif self._finished and self._starting.done():
            self._reset()  # the client refused this build's progress: the next build asks again

    def _message(self) -> tuple[str, int]:
        done, found = self._latest
        return f"{done} of {found} files", (done * 100 // found if found else 0)

    async def _begin(self) -> None:
        token = f"diffgemma-index-{uuid.uuid4().hex[:8]}"
        try:
            await self.server.work_done_progress.create_async(token)
        except Exception:  # the client refused: the status still says how far the build got
            logger.debug("client refused work done progress", exc_info=True)
            if self._finished:
                self._reset()  # the build ended while the client answered: the next one asks again
            return
        message, percentage = self._message()
        self.server.work_done_progress.begin(
            token, types.WorkDoneProgressBegin(title=TITLE, message=message, percentage=percentage)
        )
        self._token = token
        if self._finished:
            self._end()

    def _report(self) -> None:
        message, percentage = self._message()
        assert self._token is not None
        self.server.work_done_progress.report(
            self._token, types.WorkDoneProgressReport(message=message, percentage=percentage)
        )

    def _end(self) -> None:
        token = self._token
        assert token is not None
        self.server.work_done_progress.tokens.pop(token, None)  # pygls keeps every token it was given (pygls #607)
        self.server.work_done_progress.end(token, types.WorkDoneProgressEnd(message=f"{self._latest[0]} files"))
        self._reset()

    def _reset(self) -> None:
        self._token, self._starting, self._finished = None, None, False
