"""The language server's stdin read by its event loop (diffgemma_lsp/stdio.py): messages in any pieces, an orderly
exit, and the end of stdin."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

from diffgemma_lsp import stdio
from tests.support.lsp import RawLsp, server_command


async def test_a_message_written_in_pieces_is_answered_and_exit_ends_the_process(tmp_path: Path) -> None:
    lsp = await RawLsp.start(server_command(tmp_path / "unused.sock", None))
    try:
        await lsp.initialize({"diffgemma": {"enable": False}})
        body = json.dumps({"jsonrpc": "2.0", "id": 7, "method": "shutdown"}).encode()
        frame = b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
        for start in range(0, len(frame), 5):  # the header and the body split anywhere
            lsp.stdin.write(frame[start : start + 5])
            await lsp.stdin.drain()
            await asyncio.sleep(0.01)
        assert (await lsp.reply(7))["result"] is None
        lsp.notify("exit")
        assert await asyncio.wait_for(lsp.process.wait(), 30) == 0
    finally:
        await lsp.stop()


async def test_the_server_leaves_when_its_stdin_ends(tmp_path: Path) -> None:
    """An editor that dies closes the pipe without a word: the server must not linger."""
    lsp = await RawLsp.start(server_command(tmp_path / "unused.sock", None))
    try:
        await lsp.initialize({"diffgemma": {"enable": False}})
        lsp.stdin.close()
        await asyncio.wait_for(lsp.process.wait(), 30)
    finally:
        await lsp.stop()


async def test_stdin_that_is_no_pipe_is_left_to_pygls_threaded_reader(tmp_path: Path) -> None:
    """A regular file cannot be an asyncio pipe: the server then reads it as pygls does, on a thread."""
    (tmp_path / "messages").write_bytes(b"")
    with (tmp_path / "messages").open("rb") as regular:
        assert await stdio.pipe_reader(regular) is None
    read, write = os.pipe()
    with os.fdopen(read, "rb") as pipe, os.fdopen(write, "wb") as writer:
        reader = await stdio.pipe_reader(pipe)
        assert reader is not None
        writer.write(b"Content-Length: 2\r\n\r\n{}")
        writer.close()
        assert await reader.readline() == b"Content-Length: 2\r\n"
        assert await reader.readline() == b"\r\n"
        assert await reader.readexactly(2) == b"{}"
        assert await reader.readexactly(5) == b""  # the end mid-message


async def test_a_header_line_over_the_limit_is_skipped_and_the_next_request_answered(tmp_path: Path) -> None:
    """Issue 42, finding 9: after a header line over 1 MiB the next request was never answered, and the server exited
    with status 1 at the end of stdin with nothing in the log."""
    lsp = await RawLsp.start(server_command(tmp_path / "unused.sock", None))
    try:
        await lsp.initialize({"diffgemma": {"enable": False}})
        lsp.stdin.write(b"X-Junk: " + b"x" * (stdio.MAX_LINE_BYTES * 2 + 17) + b"\r\n\r\n")
        lsp.request(8, "shutdown")
        assert (await lsp.reply(8))["result"] is None
        lsp.notify("exit")
        assert await asyncio.wait_for(lsp.process.wait(), 30) == 0
    finally:
        await lsp.stop()


async def test_a_named_pipe_the_watcher_reports_does_not_keep_the_server_from_exiting(tmp_path: Path) -> None:
    """Issue 42, finding 3: the index read a named pipe called ``x.py`` once the file watcher reported it; the read
    waited for a writer for good on a worker thread, and the language server never exited."""
    workspace = tmp_path / "ws"
    workspace.mkdir()
    os.mkfifo(workspace / "x.py")
    lsp = await RawLsp.start(server_command(tmp_path / "unused.sock", None))
    try:
        await lsp.initialize({"diffgemma": {"enable": False}}, root_uri=workspace.as_uri())
        lsp.notify("workspace/didChangeWatchedFiles", {"changes": [{"uri": (workspace / "x.py").as_uri(), "type": 2}]})
        lsp.request(8, "workspace/executeCommand", {"command": "diffgemma.status"})
        assert (await lsp.reply(8))["result"]["workspaceIndex"]["files"] == 0
        lsp.request(9, "shutdown")
        await lsp.reply(9)
        lsp.notify("exit")
        async with asyncio.timeout(60):
            assert await lsp.process.wait() == 0
    finally:
        await lsp.stop()
