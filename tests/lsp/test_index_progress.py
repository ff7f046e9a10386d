"""The workspace index's progress (``index_progress.py``) over pygls' server-initiated progress: one progress per
build, and a build whose progress the client refused does not stop the next one's."""

from __future__ import annotations

import asyncio
from typing import Any

from lsprotocol import types

from diffgemma_lsp.index_progress import IndexProgress


class Progress:
    """pygls' ``work_done_progress`` as ``IndexProgress`` uses it; ``refuse`` makes ``create`` fail as a client's
    error reply does."""

    def __init__(self) -> None:
        self.refuse = False
        self.tokens: dict[str, object] = {}
        self.sent: list[tuple[str, Any]] = []

    async def create_async(self, token: str) -> None:
        if self.refuse:
            raise RuntimeError("the client refused window/workDoneProgress/create")
        self.tokens[token] = None

    def begin(self, token: str, value: types.WorkDoneProgressBegin) -> None:
        self.sent.append(("begin", value))

    def report(self, token: str, value: types.WorkDoneProgressReport) -> None:
        self.sent.append(("report", value))

    def end(self, token: str, value: types.WorkDoneProgressEnd) -> None:
        self.sent.append(("end", value))


class Server:
    def __init__(self) -> None:
        self.work_done_progress = Progress()


async def build(progress: IndexProgress, files: int) -> None:
    """A build's calls: files indexed of ``files`` found, then its end."""
    for done in range(files + 1):
        progress(done, files, finished=False)
        await asyncio.sleep(0)
    progress(files, files, finished=True)
    await asyncio.sleep(0)


async def test_a_build_whose_progress_the_client_refused_does_not_stop_the_next_builds() -> None:
    server = Server()
    # the part of pygls' server it uses
    progress = IndexProgress(server, lambda: True)  # type: ignore[arg-type]
    server.work_done_progress.refuse = True
    await build(progress, 3)
    assert server.work_done_progress.sent == []
    server.work_done_progress.refuse = False
    await build(progress, 2)  # a folder added later: its build is shown
    kinds = [kind for kind, _ in server.work_done_progress.sent]
    assert kinds[0] == "begin" and kinds[-1] == "end"
    assert server.work_done_progress.sent[-1][1].message == "2 files"
