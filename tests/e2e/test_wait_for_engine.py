"""Explicit requests wait for an engine that is still starting: "Rewrite selection" and an invoked completion, asked
for right after the editor opens, are answered once the engine is ready, with cancellable progress meanwhile, while
automatic completions answer empty at once.

The engine is slow to become ready in a real way: the test starts the real engine on the memorized checkpoint and
holds it (SIGSTOP) as soon as its socket exists, before it has answered any handshake or loaded its model; the real
language server connects to that socket (it finds the engine's lock held, so it starts no other one) and stays
"connecting" until the test lets the engine go on (SIGCONT). No fake engine."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import pytest
from lsprotocol import types
from pytest_lsp import LanguageClient

from diffgemma_lsp.backend_link import WAIT_TITLE
from diffgemma_lsp.backends.base import EngineNotReady
from diffgemma_lsp.backends.local import EngineClient
from tests.e2e.test_rewrite import RIGHT, SELECTED, URI, WRONG_MIDDLE, status
from tests.support.engine import EngineProcess
from tests.support.lsp import Editor, complete, inline_complete, rewrite, server_command, start_client
from tests.support.models import MEMORIZED_MIDDLE, MEMORIZED_PREFIX, MEMORIZED_SUFFIX

pytestmark = pytest.mark.e2e
OTHER_URI = "file:///work/other.py"
"""A second document, for the invoked completion (one request per document in the engine)."""
CURSOR = (1, 0)  # the start of the line after "def add(a, b):"


def wait_progress_began(client: LanguageClient) -> bool:
    """Whether the server has begun its "waiting for the model" progress (cancellable)."""
    return any(
        isinstance(report, types.WorkDoneProgressBegin) and report.title == WAIT_TITLE and report.cancellable
        for reports in client.progress_reports.values()
        for report in reports
    )


async def test_a_rewrite_and_an_invoked_completion_asked_while_the_engine_starts_are_answered_once_it_is_ready(
    isolated_env: Path, memorized_model_dir: Path
) -> None:
    socket_path = isolated_env / "run" / "engine.sock"
    engine = EngineProcess(memorized_model_dir, socket_path, isolated_env / "engine.log")
    os.kill(engine.process.pid, signal.SIGSTOP)  # started, and held before it has loaded anything
    client = await start_client(
        server_command(socket_path, memorized_model_dir),
        init_options={"diffgemma": {"debounceMs": 0, "extraContextTokens": 0}},
    )
    try:
        editor = Editor(client)
        editor.open(URI, MEMORIZED_PREFIX + WRONG_MIDDLE + MEMORIZED_SUFFIX)
        editor.open(OTHER_URI, MEMORIZED_PREFIX + MEMORIZED_SUFFIX)
        assert (await status(client))["engine"] in ("disconnected", "connecting"), await status(client)
        rewriting = asyncio.ensure_future(rewrite(client, URI, SELECTED, 1))
        completing = asyncio.ensure_future(complete(client, OTHER_URI, *CURSOR))
        while not wait_progress_began(client):  # both are waiting, behind one progress the user can cancel
            assert not rewriting.done(), rewriting.result()
            await asyncio.sleep(0.05)
        automatic = await inline_complete(client, OTHER_URI, *CURSOR, types.InlineCompletionTriggerKind.Automatic)
        assert list(automatic.items) == []  # typing is never held up by a loading engine
        assert not rewriting.done() and not completing.done()
        os.kill(engine.process.pid, signal.SIGCONT)
        assert await rewriting == {"applied": True, "reason": ""}, client.messages
        assert editor.text(URI) == RIGHT
        [item] = (await completing).items
        assert isinstance(item.text_edit, types.TextEdit) and item.text_edit.new_text == MEMORIZED_MIDDLE
    finally:
        os.kill(engine.process.pid, signal.SIGCONT)
        try:
            await client.shutdown_session()
        finally:
            engine.stop()


async def test_a_wait_for_an_engine_that_never_comes_gives_up_saying_so(short_tmp: Path) -> None:
    """No engine on the socket and none to start: the wait ends after its bound with the reason."""
    client = EngineClient(short_tmp / "absent.sock", start_engine=None)
    try:
        with pytest.raises(EngineNotReady, match=r"not ready after 1 s \(it is (failed|connecting)\)"):
            await client.wait_ready(1.0)
    finally:
        await client.close()
