"""The limits aiohttp leaves open, for the HTTP endpoint: how long a client may take to send a request, how long
an idle connection stays, and how many connections are open at once.

aiohttp closes an idle keep-alive connection after a request, but a connection whose request head never ends is
held for as long as the client likes, and nothing caps the number of connections: a few hundred slow clients
lock out everyone else and fill the process's file table, and asyncio then logs its accept error on every try.

``GuardedSite`` is aiohttp's ``TCPSite`` with each connection's protocol wrapped in a ``_Connection`` that a
``ConnectionGuard`` watches. A connection is *busy* from the moment its request's head has been read (the
guard's middleware runs) until its answer is sent; the handler bounds the body's reading itself
(``read_timeout_s``). A connection that is not busy is closed once a request it started sending takes longer
than ``read_timeout_s``, or after ``idle_timeout_s`` with nothing at all. At ``max_connections``, a new
connection closes the oldest one that is not busy (a stalled one first); when every one is busy, the newcomer
is answered 503 and closed. Repeated errors, asyncio's and aiohttp's, are logged once per ``LOG_REPEAT_S`` with a
count. Never imports torch.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import resource
import time
from collections.abc import Awaitable, Callable
from typing import Any

import attrs
from aiohttp import web
from aiohttp.http import HttpProcessingError

logger = logging.getLogger(__name__)

SWEEP_INTERVAL_S = 0.5
BACKLOG = 128
"""Connections the kernel queues before they are accepted (aiohttp's default)."""
RESERVED_FILES = 64 + BACKLOG
"""File descriptors kept for everything but open client connections: the engine's socket, logs, imports, and
the connections asyncio accepts in one go before the guard can close the ones over the cap."""
LOG_REPEAT_S = 10.0
"""A repeated event-loop error is logged once per this many seconds, with the count of the ones left out."""
FAULT_CHARS = 300
"""A malformed request's fault is logged in at most this many characters (aiohttp quotes what the client sent)."""
BUSY_ANSWER = (
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nRetry-After: 1\r\n"
    b"Connection: close\r\nContent-Length: %d\r\n\r\n%s"
)
BUSY_BODY = b'{"error": {"message": "too many connections; retry shortly", "type": "server_error"}}'


@attrs.frozen
class HttpLimits:
    """How long a client may take and how many may be connected."""

    read_timeout_s: float = 10.0
    """The longest a request's head may take from its first byte, and its body from the end of the head."""
    idle_timeout_s: float = 60.0
    """The longest a connection stays open with no request in it."""
    max_connections: int = 256
    """Open connections at once (lowered to what the process's file limit allows)."""


def connection_cap(wanted: int) -> int:
    """``wanted``, or fewer when the file limit (raised to its hard limit first) would run out before it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and (hard == resource.RLIM_INFINITY or soft < hard):
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
    if soft == resource.RLIM_INFINITY:
        return wanted
    return max(1, min(wanted, soft - RESERVED_FILES))


class _Connection(asyncio.Protocol):
    """One client connection: aiohttp's protocol inside, the guard's bookkeeping around it."""

    def __init__(self, inner: asyncio.Protocol, guard: ConnectionGuard) -> None:
        self.inner = inner
        self.guard = guard
        self.transport: asyncio.Transport | None = None
        self.busy = 0
        self.idle_since = time.monotonic()
        self.reading_since: float | None = None
        self.admitted = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        if self.guard.admit(self):
            self.admitted = True
            self.inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        if self.busy == 0 and self.reading_since is None:
            self.reading_since = time.monotonic()
        self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        self.guard.forget(self)
        if self.admitted:
            self.inner.connection_lost(exc)

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()

    def close(self) -> None:
        if self.transport is not None:
            self.transport.abort()


class ConnectionGuard:
    """Watches the endpoint's connections and closes the ones over its limits (see the module's docstring)."""

    def __init__(self, limits: HttpLimits) -> None:
        self.limits = limits
        self.max_connections = connection_cap(limits.max_connections)
        self._open: dict[asyncio.BaseTransport, _Connection] = {}
        self._sweeper: asyncio.Task[None] | None = None
        self.closed_stalled = 0
        self.closed_idle = 0
        self.evicted = 0
        self.refused = 0

    def __len__(self) -> int:
        return len(self._open)

    def wrap(self, factory: Callable[[], asyncio.Protocol]) -> Callable[[], asyncio.Protocol]:
        """A protocol factory for ``loop.create_server`` whose connections this guard watches."""
        return lambda: _Connection(factory(), self)

    def admit(self, connection: _Connection) -> bool:
        """Take ``connection`` in, making room at the cap; False (answered 503 and closed) when there is none."""
        if self._sweeper is None:
            self._sweeper = asyncio.get_running_loop().create_task(self._sweep())
        if len(self._open) >= self.max_connections:
            idle = [c for c in self._open.values() if c.busy == 0]
            if not idle:
                self.refused += 1
                assert connection.transport is not None
                connection.transport.write(BUSY_ANSWER % (len(BUSY_BODY), BUSY_BODY))
                connection.transport.close()
                return False
            # A stalled request first (the oldest), then the connection idle the longest.
            oldest = min(idle, key=lambda c: (c.reading_since is None, c.reading_since or c.idle_since))
            self.evicted += 1
            self._drop(oldest)
        assert connection.transport is not None
        self._open[connection.transport] = connection
        return True

    def forget(self, connection: _Connection) -> None:
        if connection.transport is not None:
            self._open.pop(connection.transport, None)

    def _drop(self, connection: _Connection) -> None:
        self.forget(connection)
        connection.close()

    async def _sweep(self) -> None:
        while True:
            await asyncio.sleep(SWEEP_INTERVAL_S)
            now = time.monotonic()
            for connection in list(self._open.values()):
                if connection.busy:
                    continue
                if connection.reading_since is not None:
                    if now - connection.reading_since > self.limits.read_timeout_s:
                        self.closed_stalled += 1
                        self._drop(connection)
                elif now - connection.idle_since > self.limits.idle_timeout_s:
                    self.closed_idle += 1
                    self._drop(connection)

    async def close(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweeper

    @web.middleware
    async def middleware(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        """Marks the request's connection busy while the request is handled (its head has been read)."""
        connection = self._open.get(request.transport) if request.transport is not None else None
        if connection is None:
            return await handler(request)
        connection.busy += 1
        connection.reading_since = None
        try:
            return await handler(request)
        finally:
            connection.busy -= 1
            connection.idle_since = time.monotonic()

    def stats(self) -> dict[str, int]:
        return {
            "open": len(self._open),
            "closed_stalled": self.closed_stalled,
            "closed_idle": self.closed_idle,
            "evicted": self.evicted,
            "refused": self.refused,
        }


class GuardedSite(web.TCPSite):
    """aiohttp's TCP site, with every connection watched by ``guard``."""

    __slots__ = ("guard",)

    def __init__(self, runner: web.BaseRunner, host: str, port: int, guard: ConnectionGuard) -> None:
        super().__init__(runner, host, port)
        self.guard = guard

    async def start(self) -> None:
        await web.BaseSite.start(self)  # registers the site with its runner; TCPSite.start would bind unguarded
        server = self._runner.server
        assert server is not None
        self._server = await asyncio.get_running_loop().create_server(
            self.guard.wrap(server), self._host, self._port, backlog=BACKLOG
        )
        self._bound_port = self._server.sockets[0].getsockname()[1] if self._server.sockets else self._port

    async def stop(self) -> None:
        await super().stop()
        await self.guard.close()


class Repeats:
    """Which occurrences of a repeated event to log: the first of each kind per ``LOG_REPEAT_S``."""

    def __init__(self) -> None:
        self._last: dict[str, tuple[float, int]] = {}

    def admit(self, kind: str) -> int | None:
        """None: leave this one out; else log it, saying how many like it were left out before it."""
        now = time.monotonic()
        last, left_out = self._last.get(kind, (float("-inf"), 0))
        if now - last < LOG_REPEAT_S:
            self._last[kind] = (last, left_out + 1)
            return None
        self._last[kind] = (now, 0)
        return left_out


def _more_like_it(message: str, left_out: int) -> str:
    return f"{message} ({left_out} more like it in the last {LOG_REPEAT_S:.0f} s)" if left_out else message


class RepeatLimitedErrors:
    """An event-loop exception handler that logs each kind of error once per ``LOG_REPEAT_S``, not every time
    (asyncio reports a failing ``accept`` on every retry)."""

    def __init__(self) -> None:
        self._repeats = Repeats()

    def __call__(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        key = str(context.get("message", ""))
        left_out = self._repeats.admit(key)
        if left_out is None:
            return
        loop.default_exception_handler({**context, "message": _more_like_it(key, left_out)})


class RepeatLimitedLog(logging.Filter):
    """A filter for aiohttp's own ``aiohttp.server`` logger, which logs every request it cannot parse with a
    traceback: each kind of record (its message and exception type) passes once per ``LOG_REPEAT_S``, and a
    malformed request's in one line, without the traceback of where aiohttp found the fault (anyone who reaches
    the port can send them, key or not)."""

    def __init__(self) -> None:
        super().__init__()
        self._repeats = Repeats()

    def filter(self, record: logging.LogRecord) -> bool:
        fault = record.exc_info[1] if record.exc_info else None
        left_out = self._repeats.admit(f"{record.msg}: {type(fault).__name__}")
        if left_out is None:
            return False
        message = record.getMessage()
        if isinstance(fault, HttpProcessingError):  # what the client sent, in one line of at most FAULT_CHARS
            summary = " ".join(str(fault).split())[:FAULT_CHARS]
            message, record.exc_info, record.exc_text = f"{message}: {summary}", None, None
        record.msg, record.args = _more_like_it(message, left_out), ()
        return True
