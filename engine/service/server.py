"""The engine's socket side: a Unix socket server on asyncio, one session per connected client.

It never imports torch: what it reports of the model comes as a plain ``diffgemma_engine.loading.model_info.ModelInfo``
from the model thread, and work reaches that thread only through ``diffgemma_engine.service.jobs``.

Security: the socket's directory is created 0700 and the socket is 0600 (``diffgemma_engine.service.socket_file``, which
keeps the file), and a peer whose uid differs from the engine's is refused here (``SO_PEERCRED``). Nothing from a
request is executed or written to disk.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

from ..errors import EngineError, describe
from ..loading.model_info import ModelInfo
from ..shared import frames, protocol, socket_paths
from .idle import idle_exit_after
from .jobs import Job, JobQueue
from .socket_file import SocketFile
from .stats import ReplyLog, rss_mb

logger = logging.getLogger(__name__)

CLOSE_WAIT_S = 2.0
"""How long ``close`` waits for the connections' handlers to finish."""
LOAD_ERROR_LINGER_S = 10.0
"""A model that fails to load before any client has connected: how long the engine waits for the one that started
it to connect and hear why (a bad folder fails in milliseconds, faster than the client's first connect)."""
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
FEATURES = (protocol.REWRITE_FEATURE, protocol.WINDOWS_FEATURE)
"""What this engine does beyond plain infills, whatever the model (``HelloOk.features``)."""


class EngineServer:
    """Accepts clients, hands their infill jobs to the model thread, and writes back the replies."""

    def __init__(self, queue: JobQueue, idle_exit_s: float | None = 0.0) -> None:
        self.queue = queue
        self.idle_exit_s = idle_exit_s
        """Exit after this long without clients (0: never; None: ``auto``, decided when the model has loaded from
        how long loading took: ``diffgemma_engine.service.idle``)."""
        self.loaded: ModelInfo | None = None
        self.load_error: str | None = None
        self._connection_ids = itertools.count(1)
        self._writers: dict[int, tuple[asyncio.StreamWriter, asyncio.Lock]] = {}
        self._handlers: set[asyncio.Task[None]] = set()
        self._waiting_ready: set[int] = set()
        self._stopped = asyncio.Event()
        self._load_error_heard = asyncio.Event()
        self._last_activity = time.monotonic()
        self.socket = SocketFile(self._handle)
        self.replies = ReplyLog()
        self.runtime_state: Callable[[], str] = lambda: ""
        """How vLLM is doing, when it runs the canvases (``CanvasRuntime.state``)."""
        self.runtime_notes: Callable[[], list[str]] = list
        """What its replies leave out of the figures (``CanvasRuntime.notes``)."""

    # -- lifecycle ---------------------------------------------------------------------------------------

    @property
    def socket_path(self) -> Path | None:
        """Where the engine listens (None once another process has the path)."""
        return self.socket.path

    async def start(self, path: Path) -> None:
        """Bind the socket (0600 in a 0700 directory); ``AlreadyRunningError`` if an engine holds it."""
        await self.socket.start(path)

    async def serve_until_stopped(self) -> None:
        """Serve until ``stop`` (a signal, a model load failure, or the idle timeout)."""
        loop = asyncio.get_running_loop()
        for signum in STOP_SIGNALS:
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(signum, self.stop)
        watchdogs = [asyncio.create_task(self.socket.watch(lambda: bool(self._writers), self.stop))]
        if self.idle_exit_s is None or self.idle_exit_s > 0:
            watchdogs.append(asyncio.create_task(self._idle_watchdog()))
        await self._stopped.wait()
        for watchdog in watchdogs:
            watchdog.cancel()
        await self.close()

    def stop(self) -> None:
        """Ask ``serve_until_stopped`` to return."""
        self._stopped.set()

    async def close(self) -> None:
        """Stop listening, close every connection (their handlers finish, rather than being cancelled at exit
        with a traceback each) and remove the socket."""
        self.socket.stop_accepting()
        for writer, _ in list(self._writers.values()):
            writer.close()
        if self._handlers:
            await asyncio.wait(list(self._handlers), timeout=CLOSE_WAIT_S)
        self.socket.remove()

    async def _idle_watchdog(self) -> None:
        while True:
            idle_exit_s = self.idle_exit_s
            await asyncio.sleep(min(1.0, idle_exit_s or 1.0))
            if idle_exit_s is None:
                continue  # auto, and the model is still loading: decided when it has loaded
            if idle_exit_s <= 0:
                return
            if not self._writers and time.monotonic() - self._last_activity > idle_exit_s:
                logger.info("no client for %.0f s: exiting", idle_exit_s)
                self.stop()
                return

    # -- model thread callbacks (called on the loop via call_soon_threadsafe) ----------------------------------

    def model_loaded(self, loaded: ModelInfo) -> None:
        """Tell the clients that connected during loading."""
        self.loaded = loaded
        if self.idle_exit_s is None:
            self.idle_exit_s = idle_exit_after(loaded.load_ms)
            logger.info("loaded in %.1f s: exit after %.0f s without clients", loaded.load_ms / 1000, self.idle_exit_s)
        ready = protocol.Ready(
            model_id=loaded.model_id,
            device=loaded.device,
            load_ms=round(loaded.load_ms, 1),
            canvas_length=loaded.canvas_length,
            max_prompt_tokens=loaded.max_prompt_tokens,
            layout=loaded.layout,
        )
        for connection in list(self._waiting_ready):
            asyncio.ensure_future(self._send(connection, ready))
        self._waiting_ready.clear()

    def model_failed(self, error: BaseException) -> None:
        """Report the load failure to every client, then stop; with no client yet, once one has heard it (or after
        ``LOAD_ERROR_LINGER_S``)."""
        self.load_error = f"model failed to load: {describe(error)}"
        message = protocol.Error(code=protocol.ErrorCode.MODEL_ERROR, message=self.load_error)
        sends = [self._send(connection, message) for connection in list(self._writers)]

        async def report_then_stop() -> None:
            await asyncio.gather(*sends, return_exceptions=True)
            if not sends:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(LOAD_ERROR_LINGER_S):
                        await self._load_error_heard.wait()
            self.stop()

        asyncio.ensure_future(report_then_stop())

    # -- connections -------------------------------------------------------------------------------------

    async def _send(self, connection: int, message: protocol.Message) -> None:
        entry = self._writers.get(connection)
        if entry is None:
            return
        writer, lock = entry
        async with lock:
            with contextlib.suppress(ConnectionError):
                writer.write(frames.encode(message))
                await writer.drain()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        handler = asyncio.current_task()
        if handler is not None:
            self._handlers.add(handler)
            handler.add_done_callback(self._handlers.discard)
        connection = next(self._connection_ids)
        self._last_activity = time.monotonic()
        try:
            uid = socket_paths.peer_uid(writer.get_extra_info("socket"))
        except OSError:  # the peer is already gone
            writer.close()
            return
        self._writers[connection] = (writer, asyncio.Lock())
        tasks: set[asyncio.Task[None]] = set()
        try:
            if uid != os.getuid():
                logger.warning("refused a connection from uid %d", uid)
                await self._send(
                    connection,
                    protocol.Error(
                        code=protocol.ErrorCode.PERMISSION_DENIED,
                        message=f"this engine serves uid {os.getuid()} only",
                    ),
                )
                return
            if not await self._handshake(connection, reader):
                return
            while True:
                try:
                    message = await frames.read_message(reader)
                except frames.ProtocolError as exc:
                    logger.warning("connection %d: %s", connection, exc)
                    await self._send(connection, exc.to_error())
                    if exc.fatal:
                        return
                    continue
                self._dispatch(connection, message, tasks)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            self.queue.cancel_connection(connection)
            self._waiting_ready.discard(connection)
            self._writers.pop(connection, None)
            self._last_activity = time.monotonic()
            writer.close()

    async def _handshake(self, connection: int, reader: asyncio.StreamReader) -> bool:
        try:
            hello = await frames.read_message(reader)
        except frames.ProtocolError as exc:
            await self._send(connection, exc.to_error())
            return False
        if not isinstance(hello, protocol.Hello):
            await self._send(
                connection,
                protocol.Error(
                    code=protocol.ErrorCode.BAD_REQUEST, message=f"expected 'hello' first, got {hello.TYPE!r}"
                ),
            )
            return False
        if hello.protocol != protocol.PROTOCOL_VERSION:
            await self._send(
                connection,
                protocol.Error(
                    code=protocol.ErrorCode.VERSION_MISMATCH,
                    message=f"engine speaks protocol {protocol.PROTOCOL_VERSION}, client {hello.protocol}",
                ),
            )
            return False
        if self.load_error is not None:
            await self._send(connection, protocol.Error(code=protocol.ErrorCode.MODEL_ERROR, message=self.load_error))
            self._load_error_heard.set()
            return False
        loaded = self.loaded
        await self._send(
            connection,
            protocol.HelloOk(
                protocol=protocol.PROTOCOL_VERSION,
                model_id=loaded.model_id if loaded else "",
                ready=loaded is not None,
                device=loaded.device if loaded else "",
                canvas_length=loaded.canvas_length if loaded else 0,
                max_prompt_tokens=loaded.max_prompt_tokens if loaded else 0,
                layout=loaded.layout if loaded else protocol.Layout.NOT_KNOWN,
                features=list(FEATURES),
            ),
        )
        if loaded is None:
            self._waiting_ready.add(connection)
        logger.info("client %d connected: %s pid %d", connection, hello.client, hello.pid)
        return True

    def _dispatch(self, connection: int, message: protocol.Message, tasks: set[asyncio.Task[None]]) -> None:
        self._last_activity = time.monotonic()
        if isinstance(message, protocol.Cancel):
            self.queue.cancel_request(connection, message.id)
        elif isinstance(message, protocol.GetStats):
            asyncio.ensure_future(self._send(connection, self.stats(message.id)))
        elif isinstance(message, protocol.Infill):
            task = asyncio.ensure_future(self._answer(connection, self._submit(connection, message)))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        else:
            asyncio.ensure_future(
                self._send(
                    connection,
                    protocol.Error(
                        code=protocol.ErrorCode.BAD_REQUEST,
                        message=f"a client may not send {message.TYPE!r}",
                        id=getattr(message, "id", None),
                    ),
                )
            )

    def _submit(self, connection: int, request: protocol.Infill) -> asyncio.Future[protocol.Result | protocol.Error]:
        """Queue ``request`` as it is read, so that a ``Cancel`` read right behind it (the same read, before a task
        could run) finds its job; the future of its one reply."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[protocol.Result | protocol.Error] = loop.create_future()
        if self.loaded is None:
            future.set_result(
                protocol.Error(code=protocol.ErrorCode.NOT_READY, message="the model is still loading", id=request.id)
            )
            return future
        job = Job(request=request, key=(connection, request.uri), loop=loop, future=future)
        try:
            self.queue.submit(job)
        except EngineError as exc:
            job.resolve(exc.to_wire(request.id))
        return future

    async def _answer(self, connection: int, reply: asyncio.Future[protocol.Result | protocol.Error]) -> None:
        answer = await reply
        self.replies.record(answer)
        await self._send(connection, answer)

    def stats(self, request_id: str) -> protocol.Stats:
        """The engine's health and recent figures."""
        loaded = self.loaded
        return protocol.Stats(
            id=request_id,
            model_id=loaded.model_id if loaded else "",
            device=loaded.device if loaded else "",
            ready=loaded is not None,
            uptime_s=round(time.monotonic() - self.replies.started, 1),
            connections=len(self._writers),
            queued=len(self.queue),
            in_flight=self.queue.in_flight(),
            replies=dict(self.replies.counts),
            recent_ms_p50=round(self.replies.percentile(0.5), 1),
            recent_ms_p95=round(self.replies.percentile(0.95), 1),
            recent_count=len(self.replies.recent_ms),
            last_error=self.load_error or self.replies.last_error,
            rss_mb=round(rss_mb(), 1),
            compiled=protocol.StepReport.parse(loaded.compile_state() if loaded else ""),
            step_ms_p50=round(self.replies.step_percentile(0.5), 2),
            max_steps=loaded.max_steps if loaded else 0,
            min_steps=loaded.min_steps if loaded else 0,
            load_ms=round(loaded.load_ms, 1) if loaded else 0.0,
            idle_exit_s=self.idle_exit_s if self.idle_exit_s is not None else -1.0,
            runtime_state=self.runtime_state(),
            runtime_notes=self.runtime_notes(),
            seeds_reproduce=loaded.seeds_reproduce if loaded else True,
        )
