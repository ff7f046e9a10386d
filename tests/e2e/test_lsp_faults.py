"""The language server under client-side faults: cancel that must reach the engine, and garbage on stdin."""

from __future__ import annotations

import asyncio
import re
import signal
from pathlib import Path

import pytest

from tests.e2e.test_lsp_engine import _engine_pid, _kill_engine
from tests.support.lsp import RawLsp, server_command

pytestmark = pytest.mark.e2e
URI = "file:///work/slow.py"


@pytest.mark.parametrize("checkpoint", ["random_model_dir", "release_random_dir"])
async def test_cancel_request_stops_the_engines_denoising(
    isolated_env: Path, checkpoint: str, request: pytest.FixtureRequest
) -> None:
    """``$/cancelRequest`` reaches the model: the engine stops that request after a few of its 200 steps (on the
    shipped format and on the released DiffusionGemma-IT's)."""
    model_dir = request.getfixturevalue(checkpoint)
    socket_path = isolated_env / "run" / "engine.sock"
    log = isolated_env / "xdg_state_home" / "diffgemma" / "engine.log"
    lsp = await RawLsp.start(server_command(socket_path, model_dir))
    try:
        await lsp.initialize({"debounceMs": 0, "steps": 200, "deadlineMs": 0})
        lsp.notify(
            "textDocument/didOpen",
            {"textDocument": {"uri": URI, "languageId": "python", "version": 1, "text": "def f():\n    "}},
        )
        params = {"textDocument": {"uri": URI}, "position": {"line": 1, "character": 4}, "context": {"triggerKind": 1}}
        deadline = asyncio.get_running_loop().time() + 120
        while "loaded" not in (log.read_text() if log.exists() else ""):
            assert asyncio.get_running_loop().time() < deadline, "the engine never loaded"
            await asyncio.sleep(0.2)
        cancelled: list[str] = []
        for request_id in range(100, 200):  # until one is cancelled while the engine works on it
            lsp.request(request_id, "textDocument/completion", params)
            await asyncio.sleep(0.2 + 0.2 * (request_id % 4))  # 200 steps take 0.7 s or more here
            lsp.notify("$/cancelRequest", {"id": request_id})
            reply = await lsp.reply(request_id)
            if "error" in reply:
                assert reply["error"]["code"] == -32800  # RequestCancelled
                await asyncio.sleep(0.5)
                cancelled = re.findall(r"request \d+: cancelled, (\d+) steps", log.read_text())
                if cancelled and int(cancelled[-1]) > 0:
                    break
            assert asyncio.get_running_loop().time() < deadline, log.read_text()[-2000:]
        assert cancelled, log.read_text()[-2000:]
        assert 0 < int(cancelled[-1]) < 200
    finally:
        await lsp.stop()
        _kill_engine(socket_path, signal.SIGTERM)


async def test_garbage_on_stdin_does_not_stop_the_server(isolated_env: Path) -> None:
    """Invalid UTF-8, invalid JSON and unknown methods get errors or are dropped; the server keeps serving."""
    socket_path = isolated_env / "run" / "engine.sock"
    lsp = await RawLsp.start(server_command(socket_path, None))
    try:
        await lsp.initialize({"enable": False})
        lsp.send_raw(b'{"jsonrpc": "2.0", "id": 2, "method": "x", "params": "\xff\xfe"}')
        lsp.send_raw(b"{not json")
        lsp.request(3, "no/such")
        assert (await lsp.reply(3))["error"]["code"] == -32601  # MethodNotFound
        lsp.request(4, "shutdown")
        assert "result" in await lsp.reply(4)
        lsp.notify("exit")
        assert await asyncio.wait_for(lsp.process.wait(), 30) == 0
        assert _engine_pid(socket_path) is None  # disabled: no engine was started
    finally:
        await lsp.stop()
        _kill_engine(socket_path, signal.SIGTERM)
