"""The real language server applies incremental edits on LSP lines: the next completion's context shows them.

A fake engine on the server's socket records the prompts it is sent and answers each with nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from lsprotocol import types
from pytest_lsp import LanguageClient

from diffgemma_engine.shared import protocol
from tests.support.fake_engine import answering_empty, serving
from tests.support.lsp import complete, open_document, server_command, start_client

pytestmark = pytest.mark.e2e
URIS = ["file:///work/sync.py", "file:///work/my%20project/sync.py"]
"""A plain URI, and one with a space as VS Code sends it (percent-encoded)."""
SOURCE = "s = '\u2028'\nt = '😀' + 1\r\nu = 2\r"
"""Three LSP lines; ``str.splitlines`` (pygls) sees four: it also breaks at the U+2028 in the string."""


@contextlib.asynccontextmanager
async def _session(
    isolated_env: Path, uri: str, source: str
) -> AsyncIterator[tuple[LanguageClient, list[protocol.Infill]]]:
    """The real language server with ``uri`` open, connected to a fake engine that records each request."""
    socket_dir = isolated_env / "run"
    socket_dir.mkdir(mode=0o700)
    received: list[protocol.Infill] = []
    async with serving(socket_dir / "engine.sock", answering_empty(received)):
        client = await start_client(
            server_command(socket_dir / "engine.sock", None),
            init_options={"diffgemma": {"debounceMs": 0, "extraContextTokens": 0}},
        )
        try:
            open_document(client, uri, source)
            deadline = asyncio.get_running_loop().time() + 30
            while not received:  # until the server has connected to the engine
                assert asyncio.get_running_loop().time() < deadline, "the server never asked the engine"
                await complete(client, uri, 0, 0)
                await asyncio.sleep(0.05)
            yield client, received
        finally:
            await client.shutdown_session()


@pytest.mark.parametrize("uri", URIS, ids=["plain", "percent-encoded"])
async def test_incremental_edits_reach_the_completion_context(isolated_env: Path, uri: str) -> None:
    async with _session(isolated_env, uri, SOURCE) as (client, received):
        client.text_document_did_change(
            types.DidChangeTextDocumentParams(
                text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=2),
                content_changes=[
                    types.TextDocumentContentChangePartial(  # "1" on line 1, after the emoji's two units
                        range=types.Range(
                            start=types.Position(line=1, character=11), end=types.Position(line=1, character=12)
                        ),
                        text="42",
                    ),
                    types.TextDocumentContentChangePartial(  # at the end, after the "\r": one "\r\n"
                        range=types.Range(
                            start=types.Position(line=3, character=0), end=types.Position(line=3, character=0)
                        ),
                        text="\n",
                    ),
                ],
            )
        )
        await complete(client, uri, 1, 13)
        edited = received[-1]
        assert (edited.prefix, edited.suffix) == ("s = '\u2028'\nt = '😀' + 42", "\r\nu = 2\r\n")
        assert edited.doc_version == 2
        await complete(client, uri, 3, 0)  # the end of the document: three lines, the last one ended
        assert (received[-1].prefix, received[-1].suffix) == ("s = '\u2028'\nt = '😀' + 42\r\nu = 2\r\n", "")


async def test_the_recent_edits_reach_the_engine_as_a_diff_after_a_pause(isolated_env: Path) -> None:
    """Issue 29, first part: an edit, once its burst of typing has paused, goes to the engine with the next
    completion as a chunk of its own (``recent edits``, a unified diff), after the chunks of other files; a
    reopened document starts with no history."""
    from diffgemma_lsp.edit_history import BURST_GAP_S

    uri, source = URIS[0], "def area(width, height):\n    return width * height\n"
    async with _session(isolated_env, uri, source) as (client, received):
        assert received[-1].extra == []
        client.text_document_did_change(
            types.DidChangeTextDocumentParams(
                text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=2),
                content_changes=[
                    types.TextDocumentContentChangePartial(
                        range=types.Range(
                            start=types.Position(line=0, character=9), end=types.Position(line=0, character=14)
                        ),
                        text="size",
                    )
                ],
            )
        )
        await complete(client, uri, 1, 11)
        assert received[-1].extra == []  # still being typed
        await asyncio.sleep(BURST_GAP_S + 0.2)
        await complete(client, uri, 1, 11)
        assert received[-1].extra == [
            protocol.Chunk(
                filename="recent edits",
                text="--- a/sync.py\n+++ b/sync.py\n@@ -1,1 +1,1 @@\n"
                "-def area(width, height):\n+def area(size, height):\n",
            )
        ]
        client.text_document_did_close(
            types.DidCloseTextDocumentParams(text_document=types.TextDocumentIdentifier(uri=uri))
        )
        open_document(client, uri, source)
        await complete(client, uri, 1, 11)
        assert received[-1].extra == []
