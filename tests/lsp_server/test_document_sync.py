"""The real language server applies incremental edits on LSP lines: the next completion's context shows them.

A fake engine on the server's socket records the prompts it is sent and answers each with nothing.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from lsprotocol import types

from diffgemma_engine.shared import protocol
from tests.support.fake_engine import answering_empty, serving
from tests.support.lsp import complete, open_document, server_command, start_client

pytestmark = pytest.mark.e2e
URIS = ["file:///work/sync.py", "file:///work/my%20project/sync.py"]
"""A plain URI, and one with a space as VS Code sends it (percent-encoded)."""
SOURCE = "s = '\u2028'\nt = '😀' + 1\r\nu = 2\r"
"""Three LSP lines; ``str.splitlines`` (pygls) sees four: it also breaks at the U+2028 in the string."""


@pytest.mark.parametrize("uri", URIS, ids=["plain", "percent-encoded"])
async def test_incremental_edits_reach_the_completion_context(isolated_env: Path, uri: str) -> None:
    socket_dir = isolated_env / "run"
    socket_dir.mkdir(mode=0o700)
    received: list[protocol.Infill] = []
    async with serving(socket_dir / "engine.sock", answering_empty(received)):
        client = await start_client(
            server_command(socket_dir / "engine.sock", None),
            init_options={"diffgemma": {"debounceMs": 0, "extraContextTokens": 0}},
        )
        try:
            open_document(client, uri, SOURCE)
            deadline = asyncio.get_running_loop().time() + 30
            while not received:  # until the server has connected to the engine
                assert asyncio.get_running_loop().time() < deadline, "the server never asked the engine"
                await complete(client, uri, 0, 0)
                await asyncio.sleep(0.05)
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
        finally:
            await client.shutdown_session()
