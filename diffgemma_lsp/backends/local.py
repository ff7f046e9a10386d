"""The local backend: the language server's connection to the engine over its Unix socket (handshake, request
ids, cancel, reconnect).

One ``EngineClient`` per language server. It keeps a connection open, starting the engine when none runs,
and reconnects (restarting the engine if need be) after the connection drops. Until the engine is ready,
``infill`` raises ``EngineUnavailable`` at once, so automatic completions answer empty instead of waiting;
explicit requests (a rewrite, an invoked completion) wait first with ``wait_ready``.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
from collections.abc import Awaitable, Callable
from pathlib import Path

import attrs

from diffgemma_engine.shared import frames, protocol, socket_paths
from diffgemma_lsp.backends.base import (
    OLD_ENGINE,
    BackendState,
    EngineNotReady,
    EngineRequestError,
    EngineUnavailable,
    RewriteUnsupported,
    StateListener,
    StateReporter,
)

logger = logging.getLogger(__name__)

CONNECT_TIMEOUT_S = 120.0
"""How long to wait for a freshly started engine's socket to appear."""
RETRY_DELAYS_S = (0.2, 0.5, 1.0, 2.0, 5.0)
STABLE_CONNECTION_S = 10.0
"""A connection that ends sooner without having answered a request counts as a failed attempt: the backoff
goes on growing instead of starting over (an engine that drops every connection is not hammered)."""
NO_DEADLINE_WAIT_S = 120.0
"""How long a request without a deadline, or one the user asked for, waits for its answer."""
ANSWER_SLACK_S = 5.0
"""How much longer than its deadline a request waits before the engine counts as not answering."""


class EngineTimeout(EngineUnavailable):
    """The engine took a request and did not answer it in time (stopped, or answering other ids)."""


class EngineStartError(OSError):
    """The engine this client started exited before it served (its reason: status and last output)."""


async def _backoff(attempt: int) -> None:
    """The wait before reconnection attempt ``attempt`` (0 first), growing to the last of ``RETRY_DELAYS_S``."""
    await asyncio.sleep(RETRY_DELAYS_S[min(attempt, len(RETRY_DELAYS_S) - 1)])


ExitCheck = Callable[[], str | None]
"""Why a started engine has exited (None while it runs, or when another engine serves instead)."""
EngineStarter = Callable[[], Awaitable[ExitCheck | None]]


class EngineClient(StateReporter):
    """Talks to one engine over its Unix socket (a ``Backend``)."""

    def __init__(
        self,
        socket_path: Path,
        start_engine: EngineStarter | None = None,
        on_state: StateListener | None = None,
        client_name: str = "diffgemma-lsp",
    ) -> None:
        super().__init__(BackendState.DISCONNECTED, on_state)
        self.socket_path = socket_path
        self.start_engine = start_engine
        self.client_name = client_name
        self.hello: protocol.HelloOk | None = None
        self.load_failure: str | None = None
        """Why the engine could not load its model; set, no engine is started again (a new client is needed,
        e.g. after the model setting changes), so a bad model folder is not reloaded every few seconds."""
        self._writer: asyncio.StreamWriter | None = None
        self._pending: dict[str, asyncio.Future[protocol.Result]] = {}
        self._ids = itertools.count(1)
        self._supervisor: asyncio.Task[None] | None = None
        self._closed = False
        self._answers = 0
        """Requests the engine has answered (result or refusal) since this client started."""
        self._refused: str | None = None
        """Why the last connection was refused as unsafe (another user's socket or engine): waiting does not make
        it safe, so an explicit request is told at once (the background reconnects go on)."""

    @property
    def model_id(self) -> str:
        """The engine's model, from the handshake (``""`` before it)."""
        return self.hello.model_id if self.hello is not None else ""

    @property
    def layout(self) -> protocol.Layout:
        """How the engine prompts its model, from the handshake (``Layout.NOT_KNOWN`` before it)."""
        return self.hello.layout if self.hello is not None else protocol.Layout.NOT_KNOWN

    @property
    def canvas_length(self) -> int:
        """The model's canvas, from the handshake (0 before it)."""
        return self.hello.canvas_length if self.hello is not None else 0

    # -- lifecycle ---------------------------------------------------------------------------------------

    def start(self) -> None:
        """Connect in the background and stay connected until ``close``."""
        if self._supervisor is None or self._supervisor.done():
            self._supervisor = asyncio.ensure_future(self._supervise())

    async def close(self) -> None:
        """Disconnect and stop reconnecting (the engine keeps running for other clients)."""
        self._closed = True
        if self._supervisor is not None:
            self._supervisor.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._supervisor
        if self._writer is not None:
            self._writer.close()
        self._fail_pending("the language server is shutting down")

    async def _supervise(self) -> None:
        attempt = 0
        while not self._closed:
            self._set_state(BackendState.CONNECTING)
            try:
                reader = await self._connect()
            except (OSError, EOFError, TimeoutError, EngineRequestError, frames.ProtocolError) as exc:
                if isinstance(exc, EngineRequestError) and exc.error.code is protocol.ErrorCode.MODEL_ERROR:
                    self._model_failed(exc.error.message)  # an engine whose model failed: do not retry it
                    return
                if isinstance(exc, EngineStartError):  # it would fail the same way again: say why, once
                    self.load_failure = str(exc)
                    self._set_state(BackendState.FAILED, self.load_failure)
                    return
                self._refused = str(exc) if isinstance(exc, socket_paths.UnsafeSocketError) else None
                self._set_state(BackendState.FAILED, f"cannot reach the engine: {exc}")
                await _backoff(attempt)
                attempt += 1
                continue
            connected_at, answers = asyncio.get_running_loop().time(), self._answers
            await self._read_loop(reader)
            self._writer = None
            self._fail_pending("the engine connection closed")
            if self.load_failure is not None:
                return  # reported when it arrived; the engine has exited
            if not self._closed:
                self._set_state(BackendState.DISCONNECTED, "the engine connection closed; reconnecting")
            lasted = asyncio.get_running_loop().time() - connected_at
            if self._answers > answers or lasted >= STABLE_CONNECTION_S:
                attempt = 0
            else:  # dropped right after the handshake: wait, longer each time
                await _backoff(attempt)
                attempt += 1

    async def _open(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        return await socket_paths.open_engine(self.socket_path)

    async def _connect(self) -> asyncio.StreamReader:
        """Open the socket (starting the engine if nothing listens) and shake hands."""
        try:
            reader, writer = await self._open()
        except (FileNotFoundError, ConnectionRefusedError):
            if self.start_engine is None:
                raise
            logger.info("no engine on %s: starting one", self.socket_path)
            exited = await self.start_engine()
            reader, writer = await self._wait_for_socket(exited)
        writer.write(
            frames.encode(protocol.Hello(protocol=protocol.PROTOCOL_VERSION, client=self.client_name, pid=os.getpid()))
        )
        await writer.drain()
        async with asyncio.timeout(CONNECT_TIMEOUT_S):
            reply = await frames.read_message(reader)
        if isinstance(reply, protocol.Error):
            writer.close()
            raise EngineRequestError(reply)
        if not isinstance(reply, protocol.HelloOk):
            writer.close()
            raise OSError(f"unexpected handshake reply {reply.TYPE!r}")
        self.hello = reply
        self._writer = writer
        self._refused = None
        logger.info("connected to engine on %s (model %s, ready %s)", self.socket_path, reply.model_id, reply.ready)
        self._set_state(BackendState.READY if reply.ready else BackendState.LOADING)
        return reader

    async def _wait_for_socket(
        self, exited: ExitCheck | None = None
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + CONNECT_TIMEOUT_S
        while True:
            try:
                return await self._open()
            except (FileNotFoundError, ConnectionRefusedError):
                if exited is not None and (reason := exited()) is not None:
                    raise EngineStartError(reason) from None
                if loop.time() > deadline:
                    raise TimeoutError(f"the engine did not open {self.socket_path}") from None
                await asyncio.sleep(0.1)

    async def _read_loop(self, reader: asyncio.StreamReader) -> None:
        while True:
            try:
                message = await frames.read_message(reader)
            except (asyncio.IncompleteReadError, ConnectionError):
                return
            except frames.ProtocolError as exc:
                logger.warning("bad frame from the engine: %s", exc)
                if exc.fatal:
                    return
                continue
            if isinstance(message, protocol.Ready):
                logger.info(
                    "engine ready: %s on %s (loaded in %.0f ms)",
                    message.model_id,
                    message.device,
                    message.load_ms,
                )
                if self.hello is not None:  # the handshake came before the model: complete what it said
                    self.hello = attrs.evolve(
                        self.hello,
                        model_id=message.model_id,
                        ready=True,
                        device=message.device,
                        canvas_length=message.canvas_length,
                        max_prompt_tokens=message.max_prompt_tokens,
                        layout=message.layout,
                    )
                self._set_state(BackendState.READY)
            elif isinstance(message, protocol.Result | protocol.Error):
                self._deliver(message)

    def _deliver(self, message: protocol.Result | protocol.Error) -> None:
        if message.id is None:
            logger.warning("engine: %s", message.message if isinstance(message, protocol.Error) else message)
            if isinstance(message, protocol.Error) and message.code is protocol.ErrorCode.MODEL_ERROR:
                self._model_failed(message.message)
            return
        future = self._pending.pop(message.id, None)
        if future is None or future.done():
            return
        self._answers += 1
        if isinstance(message, protocol.Error):
            future.set_exception(EngineRequestError(message))
        else:
            future.set_result(message)

    def _model_failed(self, message: str) -> None:
        self.load_failure = f"{message.rstrip('.')} (check the model setting)"
        self._set_state(BackendState.FAILED, self.load_failure)

    def _fail_pending(self, reason: str) -> None:
        pending, self._pending = self._pending, {}
        for future in pending.values():
            if not future.done():
                future.set_exception(EngineUnavailable(reason))

    # -- requests ----------------------------------------------------------------------------------------

    def pending_count(self) -> int:
        """Requests sent to the engine and not yet answered."""
        return len(self._pending)

    def new_id(self) -> str:
        """A request id unique on this connection."""
        return str(next(self._ids))

    async def wait_ready(self, timeout_s: float) -> None:
        """Until the engine has loaded its model and this client is connected to it (starting the engine when none
        runs), at most ``timeout_s``: ``EngineNotReady`` then; ``EngineUnavailable`` at once when its model failed
        to load or the engine could not start (it is not started again)."""
        if self.load_failure is not None:
            raise EngineUnavailable(self.load_failure)
        self.start()
        loop = asyncio.get_running_loop()
        give_up = loop.time() + timeout_s
        while self.load_failure is None and not (self.state is BackendState.READY and self._writer is not None):
            if self._refused is not None:
                raise EngineUnavailable(f"cannot reach the engine: {self._refused}")
            left = give_up - loop.time()
            if left <= 0:
                raise EngineNotReady(f"the engine was not ready after {timeout_s:.0f} s (it is {self.state.value})")
            await self._next_state(left)
        if self.load_failure is not None:
            raise EngineUnavailable(self.load_failure)

    def as_rewrite(self, request: protocol.Infill) -> protocol.Infill:
        """``request`` as it is, once the handshake said the engine starts canvases from text; an engine that
        predates rewrites would ignore ``start`` and answer an insertion, so it is not asked (``RewriteUnsupported``).
        Before the handshake, ``infill`` answers that the engine is not ready. A selection the engine would surely
        refuse as too long for its canvas is not sent either (``RewriteUnsupported`` saying so)."""
        if self.hello is not None and protocol.REWRITE_FEATURE not in self.hello.features:
            raise RewriteUnsupported(OLD_ENGINE)
        chars = sum(len(segment.text) for segment in request.start)
        model_canvas = self.hello.canvas_length if self.hello is not None else 0
        canvas = request.canvas_length or model_canvas or protocol.MAX_CANVAS_LENGTH  # the engine's choice, or more
        if chars > protocol.max_start_chars(canvas):
            raise RewriteUnsupported(
                f"the selection is {chars} characters, more than one canvas of {canvas} tokens can hold "
                f"(at most {protocol.max_start_chars(canvas)}): select less, and rewrite it a part at a time"
            )
        return request

    async def infill(self, request: protocol.Infill, *, explicit: bool = False) -> protocol.Result:
        """Send ``request`` and wait for its result (``explicit``: see ``Backend.infill``). Cancelling the caller
        cancels the engine's work."""
        writer = self._writer
        if self.load_failure is not None:
            raise EngineUnavailable(self.load_failure)
        if self.state is not BackendState.READY or writer is None:
            self.start()
            raise EngineUnavailable(f"the engine is {self.state.value}")
        try:
            frame = frames.encode(request)
        except frames.ProtocolError as exc:  # too large for one frame: the request's fault, said plainly
            raise EngineRequestError(exc.to_error()) from None
        future: asyncio.Future[protocol.Result] = asyncio.get_running_loop().create_future()
        self._pending[request.id] = future
        deadline_s = request.deadline_ms / 1000 if request.deadline_ms and not explicit else NO_DEADLINE_WAIT_S
        wait_s = deadline_s + ANSWER_SLACK_S
        try:
            writer.write(frame)
            await writer.drain()
            async with asyncio.timeout(wait_s):  # not wait_for: on 3.11 it drops a cancel that meets the answer
                return await future
        except TimeoutError:
            self._pending.pop(request.id, None)
            self._send_nowait(protocol.Cancel(id=request.id))
            raise EngineTimeout(f"the engine did not answer within {wait_s:.0f} s") from None
        except asyncio.CancelledError:
            self._pending.pop(request.id, None)
            self._send_nowait(protocol.Cancel(id=request.id))
            raise
        except ConnectionError as exc:
            self._pending.pop(request.id, None)
            raise EngineUnavailable(f"the engine connection failed: {exc}") from exc

    def _send_nowait(self, message: protocol.Message) -> None:
        if self._writer is not None and not self._writer.is_closing():
            with contextlib.suppress(ConnectionError):
                self._writer.write(frames.encode(message))
