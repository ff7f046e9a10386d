"""Talking to a vLLM server from the engine's model thread: ``/v1/completions`` over a Unix socket (``vllm serve
--uds``, checked as the engine's own socket is: a private directory, a process of this user) or an HTTP URL with a
key; ``/health`` and ``/version``.

Blocking, on the one thread that owns the runtime, as the transformers loop is: while vLLM works, the thread polls
``should_stop`` every ``POLL_S``, and a cancel or a newer request closes the connection, which makes vLLM abort the
request (its server aborts a request whose client went away). Standard library only."""

from __future__ import annotations

import base64
import http.client
import io
import json
import socket
import time
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs

from ..shared.session_key import SESSION_HEADER
from ..shared.socket_paths import check_peer, check_socket_dir
from ..shared.urls import redacted
from .completions import reply_bound

POLL_S = 0.05
"""How often a waiting request checks for a cancel (and its deadline), while it waits and while the reply comes."""
MAX_REPLY_BYTES = 1024 * 1024
"""The largest reply read when the request does not bound it (``/health``, ``/version``)."""
REPLY_TIMEOUT_S = 120.0
"""The longest any exchange with vLLM may take, reply included, when the caller gives no shorter one."""
READ_CHUNK_BYTES = 64 * 1024
MESSAGE_CHARS = 300
"""How much of what vLLM said goes into an error's message (one line)."""


def one_line(text: str, limit: int = MESSAGE_CHARS) -> str:
    """``text`` on one line (its whitespace runs made single spaces), cut to ``limit`` characters: what a message
    quotes of a reply, whatever its size."""
    flat = " ".join(text[: limit * 4].split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


class _Received:
    """A reply already read, as ``http.client.HTTPResponse`` reads a socket."""

    def __init__(self, data: bytes) -> None:
        self._data = data

    def makefile(self, mode: str) -> io.BufferedReader:
        return io.BufferedReader(io.BytesIO(self._data))


def _declared_length(received: bytes | bytearray) -> int:
    """The ``Content-Length`` the reply's head declares, once the head is in (0 before, or without one)."""
    head, found, _ = bytes(received[:65536]).partition(b"\r\n\r\n")
    if not found:
        return 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length" and value.strip().isdigit():
            return int(value.strip())
    return 0


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
        return kind(parts.hostname or "", parts.port, timeout=self.connect_timeout_s)  # not the user:password

    def _path(self, endpoint: str) -> str:
        base = urllib.parse.urlsplit(self.url).path.rstrip("/") if self.socket_path is None else ""
        return f"{base}{endpoint}"

    def _headers(self, body: bytes | None) -> dict[str, str]:
        headers = {"Accept": "application/json", "Connection": "close"}  # the reply ends when the server closes
        if body is not None:
            headers["Content-Type"] = "application/json"
        parts = urllib.parse.urlsplit(self.url) if self.socket_path is None else None
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        elif parts is not None and parts.password is not None:  # the URL's user:password, as HTTP basic auth
            token = base64.b64encode(f"{parts.username or ''}:{parts.password}".encode()).decode()
            headers["Authorization"] = f"Basic {token}"
        return headers

    def request(
        self,
        method: str,
        endpoint: str,
        payload: dict[str, Any] | None = None,
        should_stop: Callable[[], str | None] | None = None,
        max_reply_bytes: int = MAX_REPLY_BYTES,
        timeout_s: float = REPLY_TIMEOUT_S,
        headers: dict[str, str] | None = None,
    ) -> tuple[int, Any, str | None]:
        """(status, the JSON reply, None), or (0, None, the reason) when ``should_stop`` said stop first: the
        connection is then closed, which aborts the request in vLLM. ``VllmError`` when vLLM cannot be reached, its
        reply is over ``max_reply_bytes`` (refused as soon as it is: never read whole), not in within ``timeout_s``
        (a server that drips its reply), or not JSON."""
        body = json.dumps(payload).encode() if payload is not None else None
        connection = self._connection()
        deadline = time.monotonic() + timeout_s
        try:
            all_headers = {**self._headers(body), **(headers or {})}
            connection.request(method, self._path(endpoint), body=body, headers=all_headers)
            assert connection.sock is not None
            connection.sock.settimeout(POLL_S)
            reply = self._read(connection.sock, should_stop, max_reply_bytes, deadline)
            if isinstance(reply, str):
                return 0, None, reply
            response = http.client.HTTPResponse(_Received(reply))  # type: ignore[arg-type]
            response.begin()
            status, data = response.status, response.read()
        except (OSError, http.client.HTTPException) as exc:
            raise VllmError(f"vLLM at {self.where()} is not reachable: {one_line(str(exc))}") from exc
        finally:
            connection.close()
        try:
            return status, json.loads(data) if data else None, None
        except ValueError:
            raise VllmError(f"vLLM answered {status} with something that is not JSON: {one_line(repr(data))}") from None

    def _read(
        self,
        sock: socket.socket,
        should_stop: Callable[[], str | None] | None,
        max_bytes: int,
        deadline: float,
    ) -> bytes | str:
        """The whole reply as it came (the request asked the server to close after it), or the reason
        ``should_stop`` gave: looked at every ``POLL_S`` however the reply comes, at once or a byte at a time."""
        received = bytearray()
        while True:
            if should_stop is not None and (reason := should_stop()):
                return reason
            if time.monotonic() >= deadline:
                raise VllmError(
                    f"vLLM at {self.where()} did not finish its reply in time ({len(received)} bytes so far): "
                    "the request was dropped"
                )
            try:
                chunk = sock.recv(READ_CHUNK_BYTES)
            except TimeoutError:
                continue
            if not chunk:
                if not received:
                    raise VllmError(f"vLLM at {self.where()} closed the connection without a reply")
                return bytes(received)
            received += chunk
            if len(received) > max_bytes or _declared_length(received) > max_bytes:
                raise VllmError(
                    f"vLLM at {self.where()} sent a reply over {max_bytes} bytes, more than the request can need: "
                    "refused"
                )

    def where(self) -> str:
        """The server, as a message or a log names it (a password in its URL redacted)."""
        return str(self.socket_path) if self.socket_path is not None else redacted(self.url)

    def complete(
        self,
        body: dict[str, Any],
        should_stop: Callable[[], str | None] | None = None,
        timeout_s: float = REPLY_TIMEOUT_S,
        session: str = "",
    ) -> tuple[Any, str | None]:
        """``POST /v1/completions``: (the reply, None), or (None, the reason it was stopped). ``VllmError`` with
        vLLM's own message when it refuses the request."""
        status, reply, stopped = self.request(
            "POST",
            "/v1/completions",
            body,
            should_stop,
            max_reply_bytes=reply_bound(body),
            timeout_s=timeout_s,
            headers={SESSION_HEADER: session} if session else None,  # a cache-aware router keeps it on one replica
        )
        if stopped is not None:
            return None, stopped
        if status != 200:
            error = reply.get("error") if isinstance(reply, dict) else None
            message = error.get("message") if isinstance(error, dict) else None
            raise VllmError(f"vLLM refused the request ({status}): {one_line(str(message or reply))}")
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
