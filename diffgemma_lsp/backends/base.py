"""The seam between the language server and where its completions come from: the ``Backend`` protocol, its
states, its two errors, and the state reporting both backends share.

``backends/local.py`` (the engine over its Unix socket) and ``backends/remote.py`` (an OpenAI-compatible server)
satisfy ``Backend``; ``backends/connect.py`` builds the one the settings name. Everything above (debounce,
latest-wins, post-processing, reuse) is the same for both.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Callable
from typing import Protocol

from diffgemma_engine.shared import protocol


class BackendState(enum.Enum):
    """Where a backend stands."""

    DISCONNECTED = "disconnected"
    """No connection: the local backend before it first connects, or after its connection closed (it
    reconnects); the remote backend after its server could not be reached (the next request tries again)."""
    CONNECTING = "connecting"
    """Opening a connection (the local backend starts the engine when none runs); the remote backend is here
    until its server has answered once."""
    LOADING = "loading"
    """Connected; the engine is still loading its model, and says ``Ready`` when it is done."""
    READY = "ready"
    """Requests are answered."""
    FAILED = "failed"
    """The last attempt failed, for the reason reported with it. The local backend tries again unless the engine
    could not start or load its model; the remote backend tries again with the next request."""


class EngineUnavailable(Exception):
    """No ready backend to ask; the caller answers empty."""


class EngineNotReady(EngineUnavailable):
    """An explicit request waited for the backend to become ready (``Backend.wait_ready``) and gave up."""


class EngineRequestError(Exception):
    """The backend refused one request."""

    def __init__(self, error: protocol.Error) -> None:
        super().__init__(f"{error.code.value}: {error.message}")
        self.error = error


class RewriteUnsupported(Exception):
    """The backend cannot rewrite a selection; the message says what to do about it."""


OLD_ENGINE = "the running engine predates rewrites: restart it (diffgemma-lsp doctor)"
"""Why an engine that does not list ``protocol.REWRITE_FEATURE`` in its handshake is not asked for a rewrite."""


StateListener = Callable[[BackendState, str], None]
"""Told of each change of state, with a detail (why it failed, for example) or ``""``."""


class StateReporter:
    """A backend's ``state``, and ``on_state`` told when it changes (or when a state comes with a detail again:
    each failure has its reason)."""

    def __init__(self, state: BackendState, on_state: StateListener | None) -> None:
        self.state = state
        self.on_state = on_state
        self._state_waiters: list[asyncio.Future[None]] = []

    def _set_state(self, state: BackendState, detail: str = "") -> None:
        if state is self.state and not detail:
            return
        self.state = state
        waiters, self._state_waiters = self._state_waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)
        if self.on_state is not None:
            self.on_state(state, detail)

    async def _next_state(self, timeout_s: float) -> None:
        """Until the state changes (or reports again), or ``timeout_s`` passes."""
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._state_waiters.append(waiter)
        try:
            async with asyncio.timeout(max(0.0, timeout_s)):
                await waiter
        except TimeoutError:
            pass
        finally:
            if waiter in self._state_waiters:
                self._state_waiters.remove(waiter)


class Backend(Protocol):
    """What the language server and the HTTP endpoint use of a backend."""

    state: BackendState
    on_state: StateListener | None
    """Set to None to stop hearing of it (a backend being replaced: its requests failing as it closes are not an
    outage to report)."""

    @property
    def model_id(self) -> str:
        """The model that answers; ``""`` until the backend knows."""
        ...

    @property
    def layout(self) -> protocol.Layout:
        """How the model is prompted; ``Layout.NOT_KNOWN`` until known."""
        ...

    @property
    def canvas_length(self) -> int:
        """The model's canvas in tokens, the most a rewrite's selection can be; 0 until known, or where the backend
        has no canvas (a completions server)."""
        ...

    def start(self) -> None:
        """Connect in the background (idempotent)."""
        ...

    async def close(self) -> None:
        """Disconnect; requests still waiting fail with ``EngineUnavailable``."""
        ...

    def new_id(self) -> str:
        """A request id unique to this backend."""
        ...

    def pending_count(self) -> int:
        """Requests sent and not yet answered."""
        ...

    async def wait_ready(self, timeout_s: float) -> None:
        """Until the backend can answer: at once where it can, or where it is only tried by a request (the remote
        server); else while it starts or loads, at most ``timeout_s``. ``EngineNotReady`` when that passes,
        ``EngineUnavailable`` when it will not become ready (its model failed to load). Cancelling stops the wait,
        not the backend."""
        ...

    def as_rewrite(self, request: protocol.Infill) -> protocol.Infill:
        """``request``, a rewrite (its ``start`` set), as this backend serves it: unchanged where the canvas can start
        from the text, else the infill of the same span from noise (``start`` empty). ``RewriteUnsupported`` where
        it cannot serve it at all."""
        ...

    async def infill(self, request: protocol.Infill, *, explicit: bool = False) -> protocol.Result:
        """The answer to ``request``; ``EngineUnavailable`` when it cannot be had now, ``EngineRequestError``
        when it is refused. Cancelling the caller cancels the work. An ``explicit`` request (the user asked for it)
        waits as long as one without a deadline: the engine answers it after its floor of steps, which on a slow
        machine or for several candidates comes after the deadline."""
        ...
