"""Issue 42, findings 5 and 6, in the real language server: a workspace with a secret in every form (files git
ignores, hidden ones, links out of it, secrets by name and content, a ``privateFiles`` pattern, a credentials file
outside it), each opened and edited in the editor and reported by the file watcher, sends none of them in any prompt
the engine receives; a completion in a secret file is never asked at all.

A fake engine on the server's socket records every request (what the engine receives, whatever its prompt layout
makes of it: tests/e2e/test_privacy_engine.py renders them through a real engine's layouts)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from lsprotocol import types

from diffgemma_engine.shared import protocol
from tests.support.fake_engine import answering_empty, serving
from tests.support.lsp import complete, open_document, replace_text, server_command, span, start_client, status
from tests.support.private_workspace import (  # noqa: F401  (workspace: the fixture)
    MAIN,
    MARKERS,
    PRIVATE_FILES,
    with_main_and_credentials,
    workspace,
)

pytestmark = pytest.mark.e2e
LAST = MAIN.count("\n")
"""The line of ``return``, where completions are asked."""


def sent_text(request: protocol.Infill) -> str:
    return "\n".join([request.prefix, request.suffix, *(chunk.text for chunk in request.extra)])


async def test_no_private_file_reaches_a_prompt_opened_edited_or_watched(
    isolated_env: Path,
    workspace: Path,  # noqa: F811
) -> None:
    credentials = with_main_and_credentials(workspace)
    socket_dir = isolated_env / "run"
    socket_dir.mkdir(mode=0o700)
    received: list[protocol.Infill] = []
    options = {"debounceMs": 0, "privateFiles": ["customer_*"]}
    async with serving(socket_dir / "engine.sock", answering_empty(received)):
        client = await start_client(
            server_command(socket_dir / "engine.sock", None), init_options={"diffgemma": options}, root=workspace
        )
        try:
            opened = [*(workspace / name for name in PRIVATE_FILES), workspace / "linked.py", credentials]
            for path in opened:
                uri = path.as_uri()
                open_document(client, uri, path.read_text())
                replace_text(client, uri, 2, span(0, 0, 0, 0), "EDITED_IN_THE_EDITOR = 1\n")
            client.workspace_did_change_watched_files(
                types.DidChangeWatchedFilesParams(
                    changes=[
                        types.FileEvent(uri=path.as_uri(), type=types.FileChangeType.Changed)
                        for path in opened
                        if path.suffix == ".py"
                    ]
                )
            )
            for path in opened:  # closed: each becomes a file the watcher reports, read from disk
                client.text_document_did_close(
                    types.DidCloseTextDocumentParams(text_document=types.TextDocumentIdentifier(uri=path.as_uri()))
                )
            for path in opened[:4]:  # and open again (recently opened files are extra context)
                open_document(client, path.as_uri(), path.read_text())
            main = (workspace / "main.py").as_uri()
            open_document(client, main, MAIN)
            replace_text(client, main, 2, span(LAST, 11, LAST, 11), "1")
            deadline = asyncio.get_running_loop().time() + 30
            while True:  # until the index is built (the status says so)
                await complete(client, main, LAST, 12)
                state = await status(client)
                if not state["workspaceIndex"]["building"] and state["workspaceIndex"]["files"] >= 1:
                    break
                assert asyncio.get_running_loop().time() < deadline
                await asyncio.sleep(0.2)
            await complete(client, main, LAST, 12)
            asked = len(received)
            env = (workspace / ".env").as_uri()
            open_document(client, env, "API_TOKEN=dotenv-secret\n")
            assert list((await complete(client, env, 0, 10)).items) == []
            await complete(client, main, LAST, 12)
        finally:
            await client.shutdown_session()
    assert len(received) == asked + 1  # the completion in .env was never sent
    assert received and all(request.uri == main for request in received)
    leaked = {marker for request in received for marker in MARKERS if marker in sent_text(request)}
    assert leaked == set(), leaked
    assert "def shared_helper():" in sent_text(received[-1])  # what the user shares does reach the prompt
