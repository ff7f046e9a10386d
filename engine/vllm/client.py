"""Talking to a vLLM server from the engine's model thread: ``/v1/completions`` over a Unix socket (``vllm serve
--uds``, checked as the engine's own socket is: a private directory, a process of this user) or an HTTP URL with a
key; ``/health`` and ``/version``.

Blocking, on the one thread that owns the runtime, as the transformers loop is: while vLLM works, the thread polls
``should_stop`` every ``POLL_S``, and a cancel or a newer request closes the connection, which makes vLLM abort the
request (its server aborts a request whose client went away). Standard library only."""

from __future__ import annotations

import http.client
import json
import socket
import time
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs

from ..shared.socket_paths import check_peer, check_socket_dir

POLL_S = 0.05
"""How often a waiting request checks for a cancel."""
MAX_REPLY_BYTES = 64 * 1024 * 1024


class VllmError(RuntimeError):
    """vLLM could not be reached, or answered with an error (its message kept)."""


class _UnixConnection(http.client.HTTPConnection):
    """HTTP over a Unix socket whose directory and peer are checked (nothing of the user's code goes to a process
    another user runs)."""

    def __init__(self, path: Path, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self.path = path

    def connect(self) -> None:
        check_socket_dir(self.path.parent)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(str(self.path))
            check_peer(sock)
        except BaseException:
            sock.close()
            raise
        self.sock = sock


@attrs.frozen(kw_only=True)
class VllmServer:
    """Where a vLLM server listens: a Unix socket, or an HTTP(S) URL (with an API key, if it wants one)."""

    socket_path: Path | None = None
    url: str = ""
    api_key: str = ""
    connect_timeout_s: float = 5.0

    def _connection(self) -> http.client.HTTPConnection:
        if self.socket_path is not None:
            return _UnixConnection(self.socket_path, self.connect_timeout_s)
        parts = urllib.parse.urlsplit(self.url)
        kind = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
        return kind(parts.netloc, timeout=self.connect_timeout_s)

    def _path(self, endpoint: str) -> str:
        base = urllib.parse.urlsplit(self.url).path.rstrip("/") if self.socket_path is None else ""
        return f"{base}{endpoint}"

    def _headers(self, body: bytes | None) -> dict[str, str]:
        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = "application/json"
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        return headers

    def request(
        self,
        method: str,
        endpoint: str,
        payload: dict[str, Any] | None = None,
        should_stop: Callable[[], str | None] | None = None,
    ) -> tuple[int, Any, str | None]:
        """(status, the JSON reply, None), or (0, None, the reason) when ``should_stop`` said stop first: the
        connection is then closed, which aborts the request in vLLM. ``VllmError`` when vLLM cannot be reached or
        its reply is not JSON."""
        body = json.dumps(payload).encode() if payload is not None else None
        connection = self._connection()
        try:
            connection.request(method, self._path(endpoint), body=body, headers=self._headers(body))
            assert connection.sock is not None
            connection.sock.settimeout(POLL_S)
            reply = self._wait(connection, should_stop)
            if isinstance(reply, str):
                return 0, None, reply
            status, data = reply
        except (OSError, http.client.HTTPException) as exc:
            raise VllmError(f"vLLM at {self.where()} is not reachable: {exc}") from exc
        finally:
            connection.close()
        try:
            return status, json.loads(data) if data else None, None
        except ValueError:
            raise VllmError(f"vLLM answered {status} with something that is not JSON: {data[:200]!r}") from None

    def _wait(
        self, connection: http.client.HTTPConnection, should_stop: Callable[[], str | None] | None
    ) -> tuple[int, bytes] | str:
        """The reply's status and body, or the reason ``should_stop`` gave while it was awaited."""
        assert connection.sock is not None
        while True:
            if should_stop is not None and (reason := should_stop()):
                return reason
            try:
                ready = connection.sock.recv(1, socket.MSG_PEEK)
            except TimeoutError:
                continue
            if not ready:
                raise VllmError(f"vLLM at {self.where()} closed the connection without a reply")
            connection.sock.settimeout(self.connect_timeout_s + 60.0)
            response = connection.getresponse()
            return response.status, response.read(MAX_REPLY_BYTES)

    def where(self) -> str:
        """The server, as a message names it."""
        return str(self.socket_path) if self.socket_path is not None else self.url

    def complete(
        self, body: dict[str, Any], should_stop: Callable[[], str | None] | None = None
    ) -> tuple[Any, str | None]:
        """``POST /v1/completions``: (the reply, None), or (None, the reason it was stopped). ``VllmError`` with
        vLLM's own message when it refuses the request."""
        status, reply, stopped = self.request("POST", "/v1/completions", body, should_stop)
        if stopped is not None:
            return None, stopped
        if status != 200:
            message = reply.get("error", {}).get("message") if isinstance(reply, dict) else None
            raise VllmError(f"vLLM refused the request ({status}): {message or reply}")
        return reply, None

    def healthy(self) -> bool:
        """Whether ``/health`` answers 200."""
        try:
            return self.request("GET", "/health")[0] == 200
        except VllmError:
            return False

    def version(self) -> str:
        """vLLM's version (``/version``), or "" when it does not say or cannot be asked."""
        try:
            _, reply, _ = self.request("GET", "/version")
        except VllmError:
            return ""
        return str(reply.get("version", "")) if isinstance(reply, dict) else ""


def wait_until_healthy(server: VllmServer, timeout_s: float, alive: Callable[[], bool] = lambda: True) -> bool:
    """Poll ``/health`` until it answers 200 (True), ``timeout_s`` passes or ``alive()`` turns False (False)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and alive():
        if server.healthy():
            return True
        time.sleep(0.2)
    return False
