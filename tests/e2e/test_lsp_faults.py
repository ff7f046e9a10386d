"""The language server under client-side faults: cancel that must reach the engine, and garbage on stdin."""

from __future__ import annotations

import asyncio
import json
import re
import signal
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.test_lsp_engine import _kill_engine
from tests.support.lsp import server_command

pytestmark = pytest.mark.e2e
URI = "file:///work/slow.py"


async def test_cancel_request_stops_the_engines_denoising(isolated_env: Path, random_model_dir: Path) -> None:
    """``$/cancelRequest`` reaches the model: the engine stops that request after a few of its 200 steps."""
    socket_path = isolated_env / "run" / "engine.sock"
    log = isolated_env / "xdg_state_home" / "diffgemma" / "engine.log"
    lsp = await RawLsp.start(server_command(socket_path, random_model_dir))
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
        for request_id in range(100, 200):  # until one is cancelled while the engine works on it
            lsp.request(request_id, "textDocument/completion", params)
            await asyncio.sleep(1.0)
            lsp.notify("$/cancelRequest", {"id": request_id})
            reply = await lsp.reply(request_id)
            if "error" in reply:
                assert reply["error"]["code"] == -32800  # RequestCancelled
                break
            assert asyncio.get_running_loop().time() < deadline
        await asyncio.sleep(0.5)
        cancelled = re.findall(r"request \d+: cancelled, (\d+) steps", log.read_text())
        assert cancelled, log.read_text()[-2000:]
        assert 0 < int(cancelled[-1]) < 200
    finally:
        await lsp.stop()
        _kill_engine(socket_path, signal.SIGTERM)


class RawLsp:
    """A bare JSON-RPC client on the server's stdin and stdout."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process
        assert process.stdin is not None and process.stdout is not None
        self.stdin = process.stdin
        self.stdout = process.stdout

    @classmethod
    async def start(cls, command: list[str]) -> RawLsp:
        process = await asyncio.create_subprocess_exec(
            *command,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL,
        )
        return cls(process)

    def send_raw(self, payload: bytes) -> None:
        self.stdin.write(b"Content-Length: %d\r\n\r\n" % len(payload) + payload)

    def request(self, request_id: int, method: str, params: object = None) -> None:
        self.send_raw(json.dumps({"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}).encode())

    def notify(self, method: str, params: object = None) -> None:
        self.send_raw(json.dumps({"jsonrpc": "2.0", "method": method, "params": params}).encode())

    async def reply(self, want_id: int, timeout: float = 60) -> dict[str, Any]:
        async def read() -> dict[str, Any]:
            while True:
                header = await self.stdout.readuntil(b"\r\n\r\n")
                length = int(re.search(rb"Content-Length: (\d+)", header).group(1))  # type: ignore[union-attr]
                message = json.loads(await self.stdout.readexactly(length))
                if message.get("id") == want_id and "method" not in message:
                    return message

        return await asyncio.wait_for(read(), timeout)

    async def initialize(self, options: object) -> None:
        self.request(1, "initialize", {"capabilities": {}, "initializationOptions": options})
        assert "result" in await self.reply(1)
        self.notify("initialized", {})

    async def stop(self) -> None:
        if self.process.returncode is None:
            self.process.kill()
            await self.process.wait()


async def test_garbage_on_stdin_does_not_stop_the_server(isolated_env: Path) -> None:
    """Invalid UTF-8, invalid JSON and unknown methods get errors or are dropped; the server keeps serving."""
    lsp = await RawLsp.start(server_command(isolated_env / "run" / "engine.sock", None))
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
    finally:
        await lsp.stop()
