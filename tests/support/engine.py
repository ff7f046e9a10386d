"""Start a real ``diffgemma-engine serve`` process and talk to it over its socket."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from diffgemma_engine.shared import frames, protocol

ENGINE_START_TIMEOUT_S = 120
LISTEN_GRACE_S = 5.0


def wait_for_bind(process: subprocess.Popen[bytes], socket_path: Path, log: Callable[[], str] = str) -> None:
    """Wait until the engine ``process`` has bound ``socket_path`` (it binds before it loads the model). A language
    server started before that finds no engine and starts its own on the same path: the one meant to serve then
    exits and the server's outlives the run."""
    deadline = time.monotonic() + ENGINE_START_TIMEOUT_S
    while not socket_path.exists():
        if process.poll() is not None:
            raise RuntimeError(f"engine exited with {process.returncode}:\n{log()}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"engine did not open its socket:\n{log()}")
        time.sleep(0.05)


class EngineProcess:
    """A running engine on ``socket_path``; stop it with ``stop``."""

    def __init__(self, model_dir: Path, socket_path: Path, log_path: Path, extra: list[str] | None = None) -> None:
        self.socket_path = socket_path
        self.log_path = log_path
        command = [
            sys.executable,
            "-m",
            "diffgemma_engine",
            "--log-level",
            "debug",
            "--log-file",
            str(log_path),
            "serve",
            "--model",
            str(model_dir),
            "--socket",
            str(socket_path),
            *(extra or []),
        ]
        self.process = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        wait_for_bind(self.process, socket_path, self.log)

    def log(self) -> str:
        """The engine's log so far."""
        return self.log_path.read_text() if self.log_path.exists() else ""

    def stop(self) -> None:
        """SIGTERM, then SIGKILL."""
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()


class RawClient:
    """A bare protocol client for tests: frames in, frames out."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    @classmethod
    async def connect(cls, socket_path: Path, hello: bool = True, wait_ready: bool = True) -> RawClient:
        """Open a connection, shake hands and (by default) wait until the model is loaded.

        The socket file appears when the engine binds, a moment before it listens: a refused connection is tried
        again for ``LISTEN_GRACE_S``."""
        deadline = time.monotonic() + LISTEN_GRACE_S
        while True:
            try:
                reader, writer = await asyncio.open_unix_connection(str(socket_path), limit=frames.MAX_FRAME_BYTES)
                break
            except ConnectionRefusedError:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.05)
        client = cls(reader, writer)
        if hello:
            await client.send(protocol.Hello(protocol=protocol.PROTOCOL_VERSION, client="test", pid=os.getpid()))
            reply = await client.receive()
            assert isinstance(reply, protocol.HelloOk), reply
            if wait_ready and not reply.ready:
                ready = await client.receive(timeout=ENGINE_START_TIMEOUT_S)
                assert isinstance(ready, protocol.Ready), ready
        return client

    async def send(self, message: protocol.Message) -> None:
        """Write one message."""
        self.writer.write(frames.encode(message))
        await self.writer.drain()

    async def send_raw(self, data: bytes) -> None:
        """Write bytes as they are (for malformed frames)."""
        self.writer.write(data)
        await self.writer.drain()

    async def receive(self, timeout: float = 60) -> protocol.Message:
        """Read one message."""
        return await asyncio.wait_for(frames.read_message(self.reader), timeout)

    async def wait_compiled(self, timeout: float = 900) -> str:
        """Poll the engine's stats until its denoising step is no longer compiling; returns the final state."""
        deadline = time.monotonic() + timeout
        while True:
            await self.send(protocol.GetStats(id="compiled?"))
            stats = await self.receive()
            assert isinstance(stats, protocol.Stats), stats
            if str(stats.compiled) != "compiling" or time.monotonic() > deadline:
                return str(stats.compiled)
            await asyncio.sleep(0.5)

    async def close(self) -> None:
        """Close the connection."""
        self.writer.close()
        try:
            await self.writer.wait_closed()
        except ConnectionError:
            pass
