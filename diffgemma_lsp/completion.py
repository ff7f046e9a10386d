"""One completion request, from the cursor to the distinct answers: reuse → debounce → ask (latest wins, a rewrite
goes first: ``owners.py``) → stale check → post-process.

``Completer`` holds what lives between requests (the request in flight per document, the shown completions, the
extra context); the language server hands it the backend, the open documents and the settings, and turns its
answers into LSP items. ``infill_edits`` post-processes a backend's answer for the HTTP endpoint too.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence

import attrs
from lsprotocol import types
from pygls.exceptions import JsonRpcInvalidParams
from pygls.workspace import TextDocument

from diffgemma_engine.shared import protocol
from diffgemma_engine.shared.prompt import EDITS_CHUNK_NAME
from diffgemma_lsp.backends.base import Backend, EngineRequestError, EngineUnavailable
from diffgemma_lsp.backends.local import EngineTimeout
from diffgemma_lsp.context import (
    CHARS_PER_TOKEN,
    InfillContext,
    PositionError,
    build_context,
    position_after,
)
from diffgemma_lsp.edit_history import EditHistory, render
from diffgemma_lsp.extra_context import ExtraContext, file_name
from diffgemma_lsp.owners import DocumentOwners, Kind
from diffgemma_lsp.postprocess import Edit, postprocess
from diffgemma_lsp.repo.assembly import RECENT_EDIT, RECENT_FILE, ContextChunk
from diffgemma_lsp.repo.index import WorkspaceIndex
from diffgemma_lsp.repo.live import LiveIndex, path_of
from diffgemma_lsp.repo.privacy import SECRET_TEXT, Privacy, secret_text
from diffgemma_lsp.reuse import ShownCompletions
from diffgemma_lsp.settings import Settings

logger = logging.getLogger(__name__)


def infill_edits(
    backend: Backend, request: protocol.Infill, result: protocol.Result, language_id: str
) -> list[Edit | None]:
    """What each candidate of ``result`` (``backend``'s answer to ``request``) puts at the cursor, best first: its
    post-processed edit, or None where nothing is left."""
    instruct = backend.layout is protocol.Layout.CHAT  # an instruction model's answers are unwrapped first
    return [
        postprocess(request.prefix, request.suffix, raw, language_id, instruct=instruct)
        for raw in (result.text, *result.alternatives)
    ]


REWRITE_IN_FLIGHT = "a rewrite of this document is being computed; ask again once it is applied"


class Completer:
    """Completions at a cursor, latest-wins per document (``owners``)."""

    def __init__(
        self,
        backend: Callable[[], Backend | None],
        open_document: Callable[[str], TextDocument | None],
        answered: Callable[[], None],
    ) -> None:
        self.backend = backend
        """The backend to ask (started the first time); None when the settings name none that can work."""
        self.open_document = open_document
        """The open document a uri names, or None."""
        self.answered = answered
        """Called when the backend has answered a request (with a result or a refusal)."""
        self.owners = DocumentOwners()
        """Per document uri, the engine request in flight (a completion, its debounce, a rewrite or a next edit): who
        goes first is decided there, for every feature."""
        self.last_latency_ms: float | None = None
        self.last_timings: protocol.Timings | None = None
        """The backend's own timings of the last completion."""
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
        self.notify: Callable[[str], None] | None = None
        """Tells the user why a completion they invoked is not asked for (the server's ``window/showMessage``)."""

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

    def context_at(self, uri: str, position: types.Position, context_tokens: int) -> tuple[TextDocument, InfillContext]:
        """The document and its infill context, or an InvalidParams error that says what is wrong with the
        request."""
        document = self.open_document(uri)
        if document is None:
            raise JsonRpcInvalidParams(f"{uri} is not open: send textDocument/didOpen first")
        try:
            return document, build_context(document, position, context_tokens)
        except PositionError as exc:
            raise JsonRpcInvalidParams(str(exc)) from None

    def forget(self, uri: str) -> None:
        """A closed document: forget its chunk of extra context and what :meth:`forget_text` forgets."""
        self.extra.remove(uri)
        self.repo.document_closed(uri)
        self.forget_text(uri)

    def forget_text(self, uri: str) -> None:
        """A document closed or opened anew: what was computed for its text goes (its shown completion, its edits),
        and the engine's work for it stops."""
        self.shown.forget(uri)
        self.history.forget(uri)
        self.owners.stop(uri)

    def _text_of(self, uri: str) -> str | None:
        document = self.open_document(uri)
        return document.source if document is not None else None

    def reindex(self, settings: Settings, uri: str, *, at_once: bool = False) -> None:
        """Have the workspace index read an open document again: once the user pauses, or at once (a save)."""
        if settings.repo_context_tokens and (document := self.open_document(uri)) is not None:
            delay_s = 0.0 if at_once else None
            self.repo.document_changed(uri, lambda: self._text_of(uri), document.language_id or "", delay_s)

    def _lines_of(self, uri: str) -> Sequence[str] | None:
        document = self.open_document(uri)
        return document.lines if document is not None else None

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
        return self._lines_of(uri) if self.private(uri) is None else None

    def extra_chunks(
        self, settings: Settings, uri: str, line: int, character: int | None = None
    ) -> list[protocol.Chunk]:
        """:meth:`context_chunks` as the wire carries them."""
        return [
            protocol.Chunk(filename=chunk.path, text=chunk.text)
            for chunk in self.context_chunks(settings, uri, line, character)
        ]

    async def complete(
        self, settings: Settings, uri: str, position: types.Position, automatic: bool, candidates: int = 1
    ) -> list[tuple[InfillContext, str]]:
        """The distinct completions at ``position`` from ``candidates`` canvases, best first; empty when there is
        none (backend down, superseded, stale or nothing left after post-processing)."""
        if not settings.enable:
            return []
        document, context = self.context_at(uri, position, settings.context_tokens)
        if (reason := self.refusal(uri, context.prefix, context.suffix)) is not None:
            return self._refused(reason, automatic)
        source = document.source
        # the request's hold on the document while nothing is sent yet (a newer completion or a rewrite cancels it)
        marker: asyncio.Future[object] = asyncio.get_running_loop().create_future()
        if not self.owners.claim(uri, Kind.COMPLETION, marker):
            logger.info("no completion for %s: %s", uri, REWRITE_IN_FLIGHT)
            return self._refused(REWRITE_IN_FLIGHT, automatic)
        try:
            if candidates == 1 and (rest := self.shown.lookup(uri, source, context.offset)) is not None:
                return [(context, rest)]  # the user is typing what we suggested: no model call
            if automatic and settings.debounce_ms:
                await asyncio.sleep(settings.debounce_ms / 1000)
                if marker.cancelled():
                    return []  # a newer request for this document came in while we waited
            request = self._request(settings, uri, document, context, candidates)
            answer = await self._ask(request, not automatic, marker)
        finally:
            marker.cancel()  # nothing sent, or the call owns the document now: the marker leaves
        current = self.open_document(uri)
        if answer is None or current is None or current.version != context.version:
            return []  # no answer, or the document changed while the model worked: the result is stale
        backend, request, result = answer
        found: list[tuple[InfillContext, str]] = []
        for edit in infill_edits(backend, request, result, document.language_id or ""):
            if edit is None or any(edit.text == text for _, text in found):
                continue
            end = position_after(context, edit.replaced(context.suffix)) if edit.replace_to_eol else None
            found.append((attrs.evolve(context, replace_end=end), edit.text))
        if found:
            self.shown.remember(uri, source, context.offset, found[0][1])
        return found

    def _refused(self, reason: str, automatic: bool) -> list[tuple[InfillContext, str]]:
        """No completion, for ``reason``: the user who invoked it is told why (an automatic one stays quiet)."""
        if not automatic and self.notify is not None:
            self.notify(f"diffgemma: no completion: {reason}")
        return []

    def _request(
        self, settings: Settings, uri: str, document: TextDocument, context: InfillContext, candidates: int
    ) -> protocol.Infill:
        """The infill for ``context`` in ``document`` (``uri``), with its extra context, under no id yet."""
        return protocol.Infill(
            id="",  # the backend's next id, given when it is sent
            uri=uri,
            prefix=context.prefix,
            suffix=context.suffix,
            extra=self.extra_chunks(settings, uri, context.position.line, context.position.character),
            language_id=document.language_id or "",
            doc_version=context.version or 0,
            canvas_length=settings.canvas_length,
            max_steps=settings.steps,
            deadline_ms=settings.deadline_ms,
            scope=protocol.cursor_scope(context.prefix),
            candidates=candidates,
        )

    async def _ask(
        self, request: protocol.Infill, explicit: bool, marker: asyncio.Future[object]
    ) -> tuple[Backend, protocol.Infill, protocol.Result] | None:
        """``request`` under the backend's next id, in the place of ``marker`` (the request's hold on its document,
        ``owners``): a newer request for its ``uri`` cancels this one in the backend too. The backend, the request as
        sent and its result; None when there is nothing to show. An ``explicit`` request (invoked by the user) waits
        for its answer past the deadline (``Backend.infill``)."""
        backend = self.backend()
        if backend is None or marker.cancelled():
            return None
        request = attrs.evolve(request, id=backend.new_id())
        started = time.perf_counter()
        call = asyncio.ensure_future(backend.infill(request, explicit=explicit))
        self.owners.claim(request.uri, Kind.COMPLETION, call)  # in the marker's place: it stops the marker alone
        try:
            result = await call
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if current is not None and current.cancelling():
                raise  # the client cancelled this request
            return None  # superseded by a newer request for the same document
        except EngineTimeout as exc:
            logger.warning("no completion: %s", exc)
            return None
        except EngineUnavailable as exc:
            logger.debug("no completion: %s", exc)
            return None
        except EngineRequestError as exc:
            logger.warning("engine refused request %s: %s", request.id, exc)
            self.answered()
            return None
        self.answered()
        self.last_latency_ms = (time.perf_counter() - started) * 1000
        self.last_timings = result.timings
        timings = result.timings
        logger.info(
            "request %s: %s in %.0f ms (queue %.0f, tokenize %.1f, encode %.0f, denoise %.0f ms, %d steps, %d tokens,"
            " %d cached)",
            request.id,
            result.stop.value,
            self.last_latency_ms,
            timings.queue_ms,
            timings.tokenize_ms,
            timings.encode_ms,
            timings.denoise_ms,
            timings.steps,
            timings.new_tokens,
            timings.cached_tokens,
        )
        if result.stop in (protocol.StopReason.CANCELLED, protocol.StopReason.SUPERSEDED) or not result.text:
            return None
        return backend, request, result
