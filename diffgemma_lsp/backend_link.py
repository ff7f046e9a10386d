"""The session's backend, as the user sees it: connected (the local engine started) the first time a feature needs
it, its loading shown as progress, an outage reported once and its end once the backend answers again, and the
wait an explicit request makes for a backend that is still starting or loading its model."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import attrs
from lsprotocol import types
from pygls.lsp.server import LanguageServer

from diffgemma_engine.shared.urls import plain_http_elsewhere
from diffgemma_lsp.backends.base import Backend, BackendState, EngineNotReady, EngineUnavailable
from diffgemma_lsp.backends.connect import connect
from diffgemma_lsp.settings import Settings

logger = logging.getLogger(__name__)

PROGRESS_CREATE_TIMEOUT_S = 5.0
"""How long a rewrite waits for the client to accept its progress token before going on without progress."""
ENGINE_WAIT_S = 300.0
"""How long an explicit request (Rewrite selection, an invoked completion) waits for an engine that is starting or
loading its model before it gives up, saying so: the release's 48 GiB take minutes to read from a slow disk. The
wait shows cancellable progress."""
WAIT_TITLE = f"Waiting for the completion model to load (up to {ENGINE_WAIT_S / 60:.0f} min)"
WAIT_CANCELLED = "cancelled while waiting for the engine"


@attrs.frozen
class GaveUp:
    """Why an explicit request stopped waiting for the backend."""

    reason: str
    told: bool = False
    """The user knows already: they cancelled the wait, or the outage report said why (a model that failed to
    load)."""


class BackendLink:
    """The backend the settings name, and what the user is told of its state (``client``'s window messages and
    progress)."""

    def __init__(self, client: LanguageServer, settings: Callable[[], Settings], engine_socket: Path | None) -> None:
        self.client = client
        self.settings = settings
        """The settings in force (the server's)."""
        self.engine_socket = engine_socket
        """The engine to use (``--engine-socket``); None: the one for the model and device settings."""
        self.backend: Backend | None = None
        """The local engine, or the remote OpenAI-compatible server (settings ``backend``)."""
        self._progress_token: str | None = None
        self._outage_reported = False
        self._backend_wait: asyncio.Future[None] | None = None
        """The wait for the backend that explicit requests share (one progress for all of them)."""

    def warn(self, message: str) -> None:
        """Log ``message`` and show it to the user (``window/showMessage``, Warning)."""
        logger.warning("%s", message)
        self.client.window_show_message(types.ShowMessageParams(type=types.MessageType.Warning, message=message))

    def settings_changed(self, previous: Settings, settings: Settings) -> None:
        """New settings: a backend that they no longer name is closed; the next request connects to theirs."""
        if self.backend is not None and previous.backend_key() != settings.backend_key():
            old, self.backend = self.backend, None
            old.on_state = None  # its requests failing as it closes are not an outage to report
            asyncio.ensure_future(old.close())

    def start(self) -> Backend | None:
        """The backend, connected (the local engine started when none runs) the first time it is needed; None
        when the settings name none that can work (reported)."""
        if self.backend is None:
            settings = self.settings()
            if settings.backend == "openai" and plain_http_elsewhere(settings.openai_url):
                self.warn(
                    f"diffgemma: completions send your code unencrypted to {settings.openai_url}; "
                    "use https:// (a TLS proxy in front of the server) unless this network is trusted"
                )
            self.backend = connect(settings, self.engine_socket, self.on_state)
        return self.backend

    async def close(self) -> None:
        """Disconnect from the backend; a local engine keeps serving other windows and exits when idle."""
        if self.backend is not None:
            await self.backend.close()

    def on_state(self, state: BackendState, detail: str) -> None:
        """Show loading progress; report an outage once, and its end."""
        logger.info("engine %s%s", state.value, f": {detail}" if detail else "")
        if state in (BackendState.CONNECTING, BackendState.LOADING):
            self._begin_progress(
                "Loading the completion model"
                if state is BackendState.LOADING
                else "Connecting to the completion engine"
            )
        elif state is BackendState.READY:
            self._end_progress("Completion model ready")  # the outage ends with the first answer (``answered``)
        elif state in (BackendState.FAILED, BackendState.DISCONNECTED) and detail and not self._outage_reported:
            self._outage_reported = True  # one message per outage, not one per keystroke
            self._end_progress(detail)
            self.client.window_show_message(
                types.ShowMessageParams(
                    type=types.MessageType.Warning,
                    message=f"diffgemma: {detail}. Completions are off until it is back.",
                )
            )

    def answered(self) -> None:
        """A request was answered (a result or a refusal): an outage reported before is over (an engine that accepts
        connections and drops them is not "back" until it answers, so it is reported once, not once per
        reconnection)."""
        if self._outage_reported:
            self.client.window_log_message(
                types.LogMessageParams(type=types.MessageType.Info, message="diffgemma: engine is back")
            )
        self._outage_reported = False

    async def until_ready(self) -> GaveUp | None:
        """For an explicit request: wait while the backend starts or loads (at most ``ENGINE_WAIT_S``, with one
        cancellable progress shared by every request waiting). None once it can answer (or when there is no
        backend: the request says so itself); else why it gave up."""
        backend = self.start()
        if backend is None or backend.state is BackendState.READY:
            return None
        if self._backend_wait is None or self._backend_wait.done():
            self._backend_wait = asyncio.ensure_future(self._show_wait(backend))
        try:
            await asyncio.shield(self._backend_wait)  # one request cancelled ($/cancelRequest) leaves the others
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if current is not None and current.cancelling():
                raise
            return GaveUp(WAIT_CANCELLED, told=True)
        except EngineNotReady as exc:
            return GaveUp(str(exc))
        except EngineUnavailable as exc:  # its model failed to load: the outage report says so
            return GaveUp(str(exc), told=True)
        return None

    async def _show_wait(self, backend: Backend) -> None:
        waiting = asyncio.ensure_future(backend.wait_ready(ENGINE_WAIT_S))

        def cancel() -> None:
            waiting.cancel()

        async with self.cancellable_progress(WAIT_TITLE, cancel):
            await waiting

    def gave_up_waiting(self, what: str, gave_up: GaveUp) -> None:
        """Log, and tell the user unless they know, that an explicit request (``what``) got no answer because the
        backend did not become ready."""
        logger.warning("no %s: %s", what, gave_up.reason)
        if not gave_up.told:
            message = f"diffgemma: no {what}: {gave_up.reason}"
            self.client.window_show_message(types.ShowMessageParams(type=types.MessageType.Warning, message=message))

    def supports_progress(self) -> bool:
        """Whether the client takes server-initiated progress."""
        client = self.client
        window = client.client_capabilities.window if client.client_capabilities else None
        return bool(window and window.work_done_progress)

    def _begin_progress(self, title: str) -> None:
        if self._progress_token is not None or not self.supports_progress():
            return
        token = self._progress_token = f"diffgemma-{uuid.uuid4().hex[:8]}"
        progress = self.client.work_done_progress

        async def begin() -> None:
            try:
                await progress.create_async(token)
            except Exception:
                logger.debug("client refused work done progress", exc_info=True)
                return
            progress.begin(token, types.WorkDoneProgressBegin(title=title, cancellable=False))

        asyncio.ensure_future(begin())

    def _end_progress(self, message: str) -> None:
        token, self._progress_token = self._progress_token, None
        if token is not None:
            progress = self.client.work_done_progress
            progress.tokens.pop(token, None)  # pygls keeps every token it was given (pygls #607)
            progress.end(token, types.WorkDoneProgressEnd(message=message))

    @contextlib.asynccontextmanager
    async def cancellable_progress(self, title: str, on_cancel: Callable[[], None]) -> AsyncIterator[None]:
        """Progress shown while the body runs, with a cancel button that calls ``on_cancel``; none where the client
        takes no server-initiated progress or refuses the token."""
        progress = self.client.work_done_progress
        token: str | None = f"diffgemma-{uuid.uuid4().hex[:8]}" if self.supports_progress() else None
        if token is not None:
            try:
                async with asyncio.timeout(PROGRESS_CREATE_TIMEOUT_S):
                    await progress.create_async(token)
            except Exception:
                logger.debug("client refused work done progress", exc_info=True)
                token = None
        if token is not None:
            progress.begin(token, types.WorkDoneProgressBegin(title=title, cancellable=True))
            loop = asyncio.get_running_loop()
            cancelled = progress.tokens[token]  # pygls cancels it on window/workDoneProgress/cancel
            cancelled.add_done_callback(lambda future: future.cancelled() and loop.call_soon_threadsafe(on_cancel))
        try:
            yield
        finally:
            if token is not None:
                progress.tokens.pop(token, None)
                progress.end(token, types.WorkDoneProgressEnd())
