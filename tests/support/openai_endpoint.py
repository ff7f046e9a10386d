"""Run the real ``diffgemma-lsp openai`` endpoint (which starts the real engine) and talk to it with urllib."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

STARTUP_TIMEOUT_S = 120
API_KEY = "test-key-0123456789"
EXACT = ["--deadline-ms", "0"]
"""For tests that check the text: no deadline, so a busy test machine cannot cut a canvas short."""


def free_port() -> int:
    """A TCP port on loopback that nothing listens on right now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@contextlib.asynccontextmanager
async def serving_route(path: str, handler) -> AsyncIterator[str]:
    """A loopback HTTP server answering POST ``path`` with ``handler`` (a server the tests play); yields its URL."""
    from aiohttp import web

    app = web.Application()
    app.router.add_post(path, handler)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield f"http://127.0.0.1:{port}{path}"
    finally:
        await runner.cleanup()


def _limit_files(count: int) -> None:
    import resource

    resource.setrlimit(resource.RLIMIT_NOFILE, (count, count))


class Endpoint:
    """``diffgemma-lsp openai`` on loopback, with its own engine on ``socket_path``; ``stop`` ends both."""

    def __init__(
        self,
        model_dir: Path,
        socket_path: Path,
        log_path: Path,
        port: int = 0,
        extra: list[str] | None = None,
        env: dict[str, str] | None = None,
        max_files: int | None = None,
    ) -> None:
        """``max_files``: the endpoint's file descriptor limit (soft and hard), as a small ``ulimit -n`` would."""
        self.socket_path = socket_path
        self.log_path = log_path
        command = [
            sys.executable,
            "-m",
            "diffgemma_lsp",
            "openai",
            "--port",
            str(port),
            "--engine-socket",
            str(socket_path),
            "--model",
            str(model_dir),
            *(extra or []),
        ]
        environment = dict(os.environ, **(env or {}), DIFFGEMMA_API_KEY=API_KEY)
        with log_path.open("w") as log:
            self.process = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=log,
                env=environment,
                preexec_fn=None if max_files is None else lambda: _limit_files(max_files),
            )
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while not (found := re.search(r"http://127\.0\.0\.1:(\d+)/v1/completions", self.log())):
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the endpoint did not start:\n{self.log()}")
            time.sleep(0.05)
        self.port = int(found.group(1))
        self.url = f"http://127.0.0.1:{self.port}/v1/completions"

    def log(self) -> str:
        return self.log_path.read_text() if self.log_path.exists() else ""

    def wait_ready(self) -> None:
        """Until the engine behind the endpoint has loaded its model."""
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=5) as response:
                    if json.load(response)["engine"] == "ready":
                        return
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"the engine did not get ready:\n{self.log()}")
            time.sleep(0.2)

    def stop(self, signum: int = signal.SIGTERM) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signum)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def post(
    url: str, body: object, key: str | None = API_KEY, timeout: float = 60, raw: bytes | None = None
) -> tuple[int, dict[str, str], Any]:
    """POST JSON (or ``raw`` bytes) as an editor would; returns status, headers and the decoded body."""
    data = raw if raw is not None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method="POST", headers={"Content-Type": "application/json"})
    if key is not None:
        request.add_header("Authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            status, headers, payload = response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as error:
        status, headers, payload = error.code, dict(error.headers), error.read()
    text = payload.decode()
    try:
        return status, headers, json.loads(text)
    except json.JSONDecodeError:
        return status, headers, text


@contextmanager
def running_endpoint(
    model_dir: Path,
    tmp: Path,
    extra: list[str] | None = None,
    port: int = 0,
    env: dict[str, str] | None = None,
    max_files: int | None = None,
) -> Iterator[Endpoint]:
    """A ready endpoint with its own engine under ``tmp``; both are stopped afterwards."""
    from tests.e2e.test_lsp_engine import _kill_engine

    socket_path = tmp / "run" / "endpoint-engine.sock"
    server = Endpoint(
        model_dir, socket_path, tmp / "endpoint.log", port=port, extra=extra, env=env, max_files=max_files
    )
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()
        _kill_engine(socket_path, signal.SIGTERM)
