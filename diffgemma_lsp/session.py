"""What every feature (``features/``) shares: the open documents, the backend and what the user is told of it
(``backend_link.py``), the one request in flight per document (``owners.py`` states the rule), the one way to ask
the backend, and what a prompt holds besides the document (recently used files, the workspace index, the recent
edits, the definitions at the cursor), with what the user keeps private kept out.

Asking the backend (:meth:`Session.send`, then :meth:`Session.reply`; :meth:`Session.ask` does both) ends in one
:class:`Reply`: answered, or why not: not sent (a request that outranks it holds the document), stopped (superseded,
cancelled here or by the engine), timed out, unavailable, or refused. A refusal is an answer: like a result, it ends
an outage reported before.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
from collections.abc import Callable, Sequence
from urllib.parse import unquote

import attrs
from lsprotocol import types
from pygls.lsp.server import LanguageServer
from pygls.workspace import TextDocument

from diffgemma_engine.shared import protocol
from diffgemma_engine.shared.prompt import EDITS_CHUNK_NAME
from diffgemma_lsp.backend_link import BackendLink
from diffgemma_lsp.backends.base import Backend, EngineRequestError, EngineUnavailable
from diffgemma_lsp.backends.local import EngineTimeout
from diffgemma_lsp.context import CHARS_PER_TOKEN
from diffgemma_lsp.edit_history import EditHistory, render
from diffgemma_lsp.extra_context import ExtraContext, file_name
from diffgemma_lsp.owners import DocumentOwners, Kind
from diffgemma_lsp.repo.assembly import RECENT_EDIT, RECENT_FILE, ContextChunk
from diffgemma_lsp.repo.index import WorkspaceIndex
from diffgemma_lsp.repo.live import LiveIndex, path_of
from diffgemma_lsp.repo.privacy import SECRET_TEXT, Privacy, secret_text
from diffgemma_lsp.reuse import ShownCompletions
from diffgemma_lsp.settings import Settings

logger = logging.getLogger(__name__)


class Failure(enum.Enum):
    """Why a request got no result."""

    NOT_SENT = "not sent: a request that goes first is in flight for the document"
    STOPPED = "stopped"
    """Superseded by a newer request for the document, or cancelled (here, or by the engine)."""
    TIMED_OUT = "timed out"
    UNAVAILABLE = "unavailable"
    REFUSED = "refused"


@attrs.frozen(kw_only=True)
class Reply:
    """How the backend answered one request: its result, or why there is none."""

    result: protocol.Result | None = None
    """The backend's result (also when the engine says it stopped the request: ``engine_stopped``)."""
    failure: Failure | None = None
    message: str = ""
    """The backend's own words on the failure (for a refusal, the engine's error message)."""
    latency_ms: float = 0.0
    """From sending the request to its result."""

    @property
    def engine_stopped(self) -> bool:
        """The engine answered that it cancelled or superseded the request: not an answer about the code."""
        return self.result is not None and self.result.stop in (
            protocol.StopReason.CANCELLED,
            protocol.StopReason.SUPERSEDED,
        )

    @property
    def interrupted(self) -> bool:
        """Not sent, stopped here, or stopped by the engine: a newer request had the document."""
        return self.failure in (Failure.NOT_SENT, Failure.STOPPED) or self.engine_stopped


@attrs.frozen
class Sent:
    """A request on its way to the backend."""

    request: protocol.Infill
    call: asyncio.Task[protocol.Result]
    started: float
    """``time.perf_counter()`` when it was sent."""


class Session:
    """The state the features share, and their one way to the backend."""

    def __init__(
        self,
        documents: Callable[[str], TextDocument | None],
        link: BackendLink | None = None,
        client: LanguageServer | None = None,
    ) -> None:
        self.documents = documents
        """The open document under an unquoted uri, or None (the server's: pygls' workspace)."""
        self.link = link
        """The backend and its reports to the user; None: no backend (``diffgemma-lsp context``, tests)."""
        self.client = client
        """The editor, for the features' messages and edits; None outside a language server."""
        self.inflight = DocumentOwners()
        """Per document uri, the engine request in flight (a completion, its debounce, a rewrite or a next edit): who
        goes first is decided there, for every feature."""
        self.extra = ExtraContext()
        """Chunks of other files, sent as extra context."""
        self.shown = ShownCompletions()
        """The last completion per document, reused while the user types what it suggested."""
        self.history = EditHistory()
        """The recent edits of the open documents, sent as a diff after the chunks of other files."""
        self.privacy = Privacy()
        """What the user would not share (``repo/privacy.py``): never in another file's prompt; a secret in none."""
        self.repo = LiveIndex(WorkspaceIndex(privacy=self.privacy))
        """The workspace index: definitions and similar code from the workspace's files."""

    # -- the editor --------------------------------------------------------------------------------------

    def show_info(self, message: str) -> None:
        """Log ``message`` and show it to the user (``window/showMessage``, Info)."""
        logger.info("%s", message)
        if self.client is not None:
            self.client.window_show_message(types.ShowMessageParams(type=types.MessageType.Info, message=message))

    def edit_support(self) -> tuple[bool, bool]:
        """(whether the client applies edits the server sends, whether it takes versioned ones)."""
        capabilities = self.client.client_capabilities if self.client is not None else None
        workspace = capabilities.workspace if capabilities else None
        edits = workspace.workspace_edit if workspace else None
        return bool(workspace and workspace.apply_edit), bool(edits and edits.document_changes)

    # -- the backend -------------------------------------------------------------------------------------

    def backend(self) -> Backend | None:
        """The backend to ask (started the first time); None when the settings name none that can work."""
        return self.link.start() if self.link is not None else None

    def send(
        self,
        backend: Backend,
        request: protocol.Infill,
        kind: Kind,
        *,
        explicit: bool = False,
        stop: Callable[[str], object] | None = None,
    ) -> Sent | None:
        """Send ``request`` (a ``kind`` of request, under its id) to ``backend`` as the owner of its document: what
        was in flight there stops, unless it goes first (``owners.py``): then nothing is sent (None). ``stop`` stops
        this one, given why (default: cancels the call). An ``explicit`` request (invoked by the user) waits for its
        answer past the deadline (``Backend.infill``)."""
        call = asyncio.ensure_future(backend.infill(request, explicit=explicit))
        if not self.inflight.claim(request.uri, kind, call, stop):
            call.cancel()  # never sent: a request the user asked for goes first
            return None
        return Sent(request, call, time.perf_counter())

    async def reply(self, sent: Sent) -> Reply:
        """How the backend answered ``sent``. Cancelling the caller cancels the request."""
        request = sent.request
        try:
            result = await sent.call
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if current is not None and current.cancelling():
                sent.call.cancel()
                raise  # the client cancelled the request
            return Reply(failure=Failure.STOPPED)  # superseded or stopped here
        except EngineTimeout as exc:
            logger.warning("no answer to %s: %s", request.id, exc)
            return Reply(failure=Failure.TIMED_OUT, message=str(exc))
        except EngineUnavailable as exc:  # the outage is reported once (``BackendLink.on_state``), not per request
            logger.debug("no answer to %s: %s", request.id, exc)
            return Reply(failure=Failure.UNAVAILABLE, message=str(exc))
        except EngineRequestError as exc:
            logger.warning("engine refused request %s: %s", request.id, exc)
            self.answered()
            return Reply(failure=Failure.REFUSED, message=exc.error.message)
        self.answered()
        latency_ms = (time.perf_counter() - sent.started) * 1000
        timings = result.timings
        logger.info(
            "request %s: %s in %.0f ms (queue %.0f, tokenize %.1f, encode %.0f, denoise %.0f ms, %d steps, %d tokens,"
            " %d cached)",
            request.id,
            result.stop.value,
            latency_ms,
            timings.queue_ms,
            timings.tokenize_ms,
            timings.encode_ms,
            timings.denoise_ms,
            timings.steps,
            timings.new_tokens,
            timings.cached_tokens,
        )
        return Reply(result=result, latency_ms=latency_ms)

    async def ask(self, backend: Backend, request: protocol.Infill, kind: Kind, *, explicit: bool = False) -> Reply:
        """:meth:`send`, then :meth:`reply`."""
        sent = self.send(backend, request, kind, explicit=explicit)
        return await self.reply(sent) if sent is not None else Reply(failure=Failure.NOT_SENT)

    def answered(self) -> None:
        """The backend answered a request (a result or a refusal): an outage reported before is over."""
        if self.link is not None:
            self.link.answered()

    # -- the documents -----------------------------------------------------------------------------------

    def open_document(self, uri: str) -> TextDocument | None:
        """The open document ``uri`` names, or None. pygls keeps documents under their unquoted URIs (it looks
        them up so too): ``file:///my%20project/a.py`` is the document opened under that URI."""
        return self.documents(unquote(uri))

    def private(self, uri: str) -> str | None:
        """Why the document ``uri`` must not go into another file's prompt by its path, or None
        (``Privacy.private``; an untitled buffer has no file to be ignored, hidden or outside). What it holds is
        checked where it is taken: a chunk of it, an edit of it."""
        path = path_of(uri)
        return self.privacy.private(path) if path is not None else None

    def refusal(self, uri: str, *sent: str) -> str | None:
        """Why nothing of the document ``uri`` may be sent (a completion, a rewrite or a next edit in it, with ``sent``
        its text that the request carries), or None: a secret, by its name, the user's patterns or that text."""
        path = path_of(uri)
        reason = self.privacy.secret(path) if path is not None else None
        if reason is None and any(secret_text(text) for text in sent):
            reason = SECRET_TEXT
        if reason is not None:
            logger.info("nothing sent for %s: %s", uri, reason)
        return reason

    def forget(self, uri: str, reason: str) -> None:
        """A closed document (``reason``): forget its chunk of extra context and what :meth:`forget_text` forgets."""
        self.extra.remove(uri)
        self.repo.document_closed(uri)
        self.forget_text(uri, reason)

    def forget_text(self, uri: str, reason: str) -> None:
        """A document closed or opened anew (``reason``): what was computed for its text goes (its shown completion,
        its edits), and the engine's work for it stops, saying ``reason``."""
        self.shown.forget(uri)
        self.history.forget(uri)
        self.inflight.stop(uri, reason)

    def _text_of(self, uri: str) -> str | None:
        document = self.open_document(uri)
        return document.source if document is not None else None

    def reindex(self, settings: Settings, uri: str, *, at_once: bool = False) -> None:
        """Have the workspace index read an open document again: once the user pauses, or at once (a save)."""
        if settings.repo_context_tokens and (document := self.open_document(uri)) is not None:
            delay_s = 0.0 if at_once else None
            self.repo.document_changed(uri, lambda: self._text_of(uri), document.language_id or "", delay_s)

    # -- the prompt's context ----------------------------------------------------------------------------

    def context_chunks(
        self, settings: Settings, uri: str, line: int, character: int | None = None
    ) -> list[ContextChunk]:
        """What the prompt holds besides the document, for a cursor on ``line`` (at ``character``, in the client's
        units, where known): chunks of recently used files, then what the workspace index gives (definitions,
        similar code), then the recent edits as one diff, each within its budget in a stable order; last, nearest
        the document, the definitions of the names at the cursor (they change as the user types)."""
        self.extra.take_edits(uri, self._text_of)
        budget = settings.extra_context_tokens * CHARS_PER_TOKEN
        extra = self.extra.for_request(uri, budget, lambda chunk: not chunk.secret and self.private(chunk.uri) is None)
        chunks = [ContextChunk(origin=RECENT_FILE, path=chunk.name, text=chunk.text) for chunk in extra]
        document = self.open_document(uri)
        at_cursor: list[ContextChunk] = []
        if settings.repo_context_tokens and document is not None:
            language_id = document.language_id or ""  # LSP's id (LineDocument maps the editors' names)
            budget = settings.repo_context_tokens * CHARS_PER_TOKEN
            source, lines = document.source, document.lines
            chunks += self.repo.chunks(uri, source, lines, language_id, line, budget)
            if character is not None and line < len(lines):
                position = types.Position(line=line, character=character)
                column = document.position_codec.position_from_client_units(lines, position).character
                at_cursor = self.repo.cursor_chunks(uri, source, lines, language_id, line, column, budget)
        hunks = self.history.recent(self._shared_lines_of, settings.edit_history_tokens * CHARS_PER_TOKEN)
        if hunks:
            chunks.append(ContextChunk(origin=RECENT_EDIT, path=EDITS_CHUNK_NAME, text=render(hunks, file_name)))
        return [chunk for chunk in chunks + at_cursor if not secret_text(chunk.text)]  # a key pasted into a shared file

    def _shared_lines_of(self, uri: str) -> Sequence[str] | None:
        """The lines of the open document ``uri`` where it may go into prompts, else None."""
        document = self.open_document(uri)
        return document.lines if document is not None and self.private(uri) is None else None

    def extra_chunks(
        self, settings: Settings, uri: str, line: int, character: int | None = None
    ) -> list[protocol.Chunk]:
        """:meth:`context_chunks` as the wire carries them."""
        return [
            protocol.Chunk(filename=chunk.path, text=chunk.text)
            for chunk in self.context_chunks(settings, uri, line, character)
        ]
