"""The language server's JSON-RPC edge, where pygls runs the handlers: a cancelled command stops its work in the
engine and edits nothing, and 50,000 keystrokes leave the process no bigger. The real language server over stdio;
for the cancel, the real engine on the memorized checkpoint."""

from __future__ import annotations

import asyncio
import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest
from lsprotocol import types
from pygls.exceptions import JsonRpcRequestCancelled

from diffgemma_engine.shared import protocol
from diffgemma_lsp.features.rewrite import REWRITE_COMMAND
from tests.e2e.test_lsp_engine import _kill_engine, lsp_session
from tests.e2e.test_rewrite import SELECTED, URI, WRONG_MIDDLE
from tests.support.engine import RawClient
from tests.support.lsp import Editor, RawLsp, server_command, status, until_ready
from tests.support.models import MEMORIZED_PREFIX, MEMORIZED_SUFFIX

pytestmark = pytest.mark.e2e
KEYSTROKES = 50_000
WARM_UP = 5_000
"""Keystrokes typed before the first measure, so that what the first messages allocate once is not counted."""
BATCH = 2_500
"""Messages written to the server's stdin in one go."""
MAX_GROWTH_KB = 5 * 1024
CANCELLED_ID = "rewrite-to-cancel"


async def _engine_replies(socket_path: Path, at_least: int, timeout: float = 60) -> dict[str, int]:
    """The engine's reply counts, once it has sent ``at_least`` replies."""
    engine = await RawClient.connect(socket_path)
    try:
        deadline = asyncio.get_running_loop().time() + timeout
        while True:
            await engine.send(protocol.GetStats(id="stats"))
            stats = await engine.receive()
            assert isinstance(stats, protocol.Stats), stats
            if sum(stats.replies.values()) >= at_least or asyncio.get_running_loop().time() > deadline:
                return stats.replies
            await asyncio.sleep(0.1)
    finally:
        await engine.close()


async def test_a_cancelled_rewrite_stops_the_engines_work_and_edits_nothing(
    isolated_env: Path, memorized_model_dir: Path
) -> None:
    """Before: pygls answered the cancel, and the command it runs under another id went on; the engine answered
    the rewrite in full and the edit was applied after the editor had been told it was cancelled. The engine is
    held (SIGSTOP) while the command is sent and cancelled, so that the request and its cancel wait in its socket
    together; the engine reads both before its model thread may take the request, so the answer is ``cancelled``."""
    async with lsp_session(isolated_env, memorized_model_dir) as (client, socket_path):
        editor = Editor(client)
        original = MEMORIZED_PREFIX + WRONG_MIDDLE + MEMORIZED_SUFFIX
        editor.open(URI, original)
        await until_ready(client)
        pid = _kill_engine(socket_path, signal.SIGSTOP)
        assert pid is not None
        try:
            argument = {"uri": URI, "range": client.protocol._converter.unstructure(SELECTED), "version": 1}
            params = types.ExecuteCommandParams(command=REWRITE_COMMAND, arguments=[argument])
            answer = client.protocol.send_request(types.WORKSPACE_EXECUTE_COMMAND, params, msg_id=CANCELLED_ID)
            deadline = asyncio.get_running_loop().time() + 30
            while (await status(client))["pending"] != 1:  # sent to the engine, and not answered
                assert asyncio.get_running_loop().time() < deadline, "the rewrite never reached the engine"
                await asyncio.sleep(0.05)
            client.protocol.notify(types.CANCEL_REQUEST, types.CancelParams(id=CANCELLED_ID))
            with pytest.raises(JsonRpcRequestCancelled):
                await asyncio.wait_for(asyncio.wrap_future(answer), 30)
            await status(client)  # the server has taken the cancel
        finally:
            os.kill(pid, signal.SIGCONT)
        replies = await _engine_replies(socket_path, at_least=1)
        await asyncio.sleep(1.0)  # time for an edit to follow, as it did before
        await status(client)
        print(f"cancelled rewrite: engine replies {replies}, {len(editor.edits)} edit(s) sent")
        assert replies == {protocol.StopReason.CANCELLED.value: 1}, replies  # the engine got the Cancel
        assert editor.edits == []
        assert editor.text(URI) == original


def _frame(message: dict[str, object]) -> bytes:
    payload = json.dumps(message).encode()
    return b"Content-Length: %d\r\n\r\n" % len(payload) + payload


def _typing(
    uri: str, start: int, count: int, version: int, other_every: int = 500, folder: str = "file:///work"
) -> tuple[bytes, int]:
    """``count`` keystrokes typed into ``uri`` (one ``didChange`` each, a line break every 60), every
    ``other_every``th also opening and closing another file of ``folder``; the frames and the document's next
    version."""
    frames = bytearray()
    for stroke in range(start, start + count):
        line, column = divmod(stroke, 61)
        text = "\n" if column == 60 else "x"
        change = {
            "range": {"start": {"line": line, "character": column}, "end": {"line": line, "character": column}},
            "text": text,
        }
        frames += _frame(
            {
                "jsonrpc": "2.0",
                "method": "textDocument/didChange",
                "params": {"textDocument": {"uri": uri, "version": version}, "contentChanges": [change]},
            }
        )
        version += 1
        if stroke % other_every == 0:
            other = f"{folder}/other{stroke}.py"
            text = f"import os\n\n\ndef other_{stroke}(path):\n    return os.path.join(path, 'x')\n"
            document = {"uri": other, "languageId": "python", "version": 1, "text": text}
            frames += _frame({"jsonrpc": "2.0", "method": "textDocument/didOpen", "params": {"textDocument": document}})
            frames += _frame(
                {"jsonrpc": "2.0", "method": "textDocument/didClose", "params": {"textDocument": {"uri": other}}}
            )
    return bytes(frames), version


def _rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError(f"no VmRSS for {pid}")


async def test_typing_50000_keystrokes_does_not_grow_the_language_server(short_tmp: Path) -> None:
    """Before: pygls kept a future for every notification, about 2 KB a keystroke (+98 MB after 50,000)."""
    uri = "file:///work/typed.py"
    lsp = await RawLsp.start(server_command(short_tmp / "unused.sock", None))
    request_id = 10
    try:
        await lsp.initialize({"diffgemma": {"enable": False}})  # no engine: only the document sync runs
        lsp.open(uri, "")
        version, typed = 2, 0

        async def type_keys(count: int) -> None:
            nonlocal version, typed, request_id
            for start in range(typed, typed + count, BATCH):
                frames, version = _typing(uri, start, BATCH, version)
                lsp.stdin.write(frames)
                await lsp.stdin.drain()
            typed += count
            request_id += 1
            lsp.request(request_id, "workspace/executeCommand", {"command": "diffgemma.status"})
            await lsp.reply(request_id, timeout=300)  # answered after every notification before it

        await type_keys(WARM_UP)
        before = _rss_kb(lsp.process.pid)
        await type_keys(KEYSTROKES)
        after = _rss_kb(lsp.process.pid)
        growth = after - before
        print(
            f"language server memory: {before / 1024:.1f} MB, {after / 1024:.1f} MB after {KEYSTROKES} keystrokes "
            f"(+{growth / 1024:.2f} MB, {growth * 1024 / KEYSTROKES:.0f} bytes a keystroke)"
        )
        assert growth < MAX_GROWTH_KB, growth
    finally:
        await lsp.stop()


async def test_10000_documents_opened_and_closed_and_50000_keystrokes_do_not_grow_it(short_tmp: Path) -> None:
    """Issue 42, finding 7: documents opened and closed in a burst stayed in the workspace index (their text indexed
    after the close), reaching prompts, and memory grew (+47 MB per 10,000 open/close pairs). The defaults (no engine
    started: the language server's memory is measured), a workspace folder, 10,000 other files opened and closed while
    50,000 keystrokes are typed."""
    workspace = short_tmp / "ws"
    workspace.mkdir()
    folder = workspace.as_uri()
    uri = f"{folder}/typed.py"
    lsp = await RawLsp.start(server_command(short_tmp / "unused.sock", None))
    request_id = 10
    try:
        await lsp.initialize({"diffgemma": {"enable": False}}, root_uri=folder)  # no engine started
        lsp.open(uri, "")
        version, typed = 2, 0

        async def type_keys(count: int) -> dict[str, Any]:
            nonlocal version, typed, request_id
            for start in range(typed, typed + count, BATCH):
                frames, version = _typing(uri, start, BATCH, version, other_every=5, folder=folder)
                lsp.stdin.write(frames)
                await lsp.stdin.drain()
            typed += count
            while True:  # until the index's work for the closed files is done
                request_id += 1
                lsp.request(request_id, "workspace/executeCommand", {"command": "diffgemma.status"})
                status: dict[str, Any] = (await lsp.reply(request_id, timeout=600))["result"]
                if status["tasks"] <= 8:
                    return status
                await asyncio.sleep(0.5)

        await type_keys(WARM_UP)
        before = _rss_kb(lsp.process.pid)
        status = await type_keys(KEYSTROKES)
        after = _rss_kb(lsp.process.pid)
        growth = after - before
        print(
            f"language server memory: {before / 1024:.1f} MB, {after / 1024:.1f} MB after {KEYSTROKES} keystrokes "
            f"and {KEYSTROKES // 5} documents opened and closed (+{growth / 1024:.2f} MB); "
            f"index {status['workspaceIndex']}"
        )
        assert status["workspaceIndex"]["files"] <= 1, status  # the typed document at most
        assert growth < MAX_GROWTH_KB, growth
    finally:
        await lsp.stop()
