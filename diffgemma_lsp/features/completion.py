"""One completion request, from the cursor to the LSP items: reuse → debounce → refine or ask (latest wins, a rewrite
goes first: the session's map) → stale check → post-process → a menu item (``textDocument/completion``) or ghost text
(``textDocument/inlineCompletion``, up to ``candidates`` of them when invoked).

Where the user typed into the shown suggestion something it does not start with, the request asked is its refine
(``refine.py``): the same completion, its canvas started from the shown text where it was offered, the typed text
held, ``refineSteps`` steps; it answers the same way, and supersedes and is superseded as any completion. A refine
that keeps nothing after the typed text is followed at once by a new completion at the cursor, so the keystroke
still gets a suggestion."""

from __future__ import annotations

import asyncio
import logging

import attrs
from lsprotocol import types
from pygls.exceptions import JsonRpcInvalidParams
from pygls.workspace import TextDocument

from diffgemma_engine.shared import protocol
from diffgemma_lsp.backends.base import RewriteUnsupported
from diffgemma_lsp.context import InfillContext, PositionError, build_context, position_after
from diffgemma_lsp.owners import Kind
from diffgemma_lsp.postprocess import Edit, infill_edits
from diffgemma_lsp.postprocess.confidence import Scored
from diffgemma_lsp.refine import Divergence, diverged, refine_request, refined
from diffgemma_lsp.results import completion_item, inline_item
from diffgemma_lsp.session import Session
from diffgemma_lsp.settings import Settings

logger = logging.getLogger(__name__)

REWRITE_IN_FLIGHT = "a rewrite of this document is being computed; ask again once it is applied"


class Completions:
    """Completions at a cursor over the session, latest-wins per document (the session's map)."""

    def __init__(self, session: Session) -> None:
        self.session = session
        self.last_latency_ms: float | None = None
        self.last_timings: protocol.Timings | None = None
        """The backend's own timings of the last completion."""

    async def menu(self, settings: Settings, params: types.CompletionParams) -> types.CompletionList:
        """One item carrying the whole multi-line completion as a text edit.

        Editors also ask for the menu as the user types, some of them as "invoked" (Helix), so the menu always
        costs one canvas; candidates to cycle through come from an invoked inline completion.
        """
        invoked = params.context is not None and params.context.trigger_kind == types.CompletionTriggerKind.Invoked
        if invoked and not await self._backend_ready(settings):
            return types.CompletionList(is_incomplete=True, items=[])
        found = await self.complete(settings, params.text_document.uri, params.position, automatic=not invoked)
        snippets = self._snippet_support()
        items = [completion_item(context, found_text.text, snippets, invoked) for context, found_text in found]
        return types.CompletionList(is_incomplete=True, items=items)

    async def inline(self, settings: Settings, params: types.InlineCompletionParams) -> types.InlineCompletionList:
        """Ghost text at the cursor; when invoked explicitly, up to ``candidates`` of them to cycle through."""
        automatic = params.context.trigger_kind == types.InlineCompletionTriggerKind.Automatic
        candidates = 1 if automatic else settings.candidates
        if not automatic and not await self._backend_ready(settings):
            return types.InlineCompletionList(items=[])
        found = await self.complete(
            settings, params.text_document.uri, params.position, automatic, candidates, scored=True
        )
        return types.InlineCompletionList(items=[inline_item(context, text) for context, text in found])

    async def _backend_ready(self, settings: Settings) -> bool:
        """For an invoked completion: wait for a backend that is starting or loading; False (the user told why
        where they do not know) when it gave up."""
        link = self.session.link
        if link is None or not settings.enable or (gave_up := await link.until_ready()) is None:
            return True
        link.gave_up_waiting("completion", gave_up)
        return False

    def _snippet_support(self) -> bool:
        client = self.session.client
        caps = client.client_capabilities.text_document if client and client.client_capabilities else None
        item = caps.completion.completion_item if caps and caps.completion else None
        return bool(item and item.snippet_support)

    def context_at(self, uri: str, position: types.Position, context_tokens: int) -> tuple[TextDocument, InfillContext]:
        """The document and its infill context, or an InvalidParams error that says what is wrong with the
        request."""
        document = self.session.open_document(uri)
        if document is None:
            raise JsonRpcInvalidParams(f"{uri} is not open: send textDocument/didOpen first")
        try:
            return document, build_context(document, position, context_tokens)
        except PositionError as exc:
            raise JsonRpcInvalidParams(str(exc)) from None

    async def complete(
        self,
        settings: Settings,
        uri: str,
        position: types.Position,
        automatic: bool,
        candidates: int = 1,
        *,
        scored: bool = False,
    ) -> list[tuple[InfillContext, Scored]]:
        """The distinct completions at ``position`` from ``candidates`` canvases, best first, each with the model's
        confidence in its characters where known; empty when there is none (backend down, superseded, stale or
        nothing left after post-processing)."""
        if not settings.enable:
            return []
        session = self.session
        document, context = self.context_at(uri, position, settings.context_tokens)
        if (reason := session.refusal(uri, context.prefix, context.suffix)) is not None:
            return self._refused(reason, automatic)
        source = document.source
        # the request's hold on the document while nothing is sent yet (a newer completion or a rewrite cancels it)
        marker: asyncio.Future[object] = asyncio.get_running_loop().create_future()
        if not session.inflight.claim(uri, Kind.COMPLETION, marker):
            logger.info("no completion for %s: %s", uri, REWRITE_IN_FLIGHT)
            return self._refused(REWRITE_IN_FLIGHT, automatic)
        try:
            if candidates == 1 and (rest := session.shown.lookup(uri, source, context.offset)) is not None:
                return [(context, rest)]  # the user is typing what we suggested: no model call
            if automatic and settings.debounce_ms:
                await asyncio.sleep(settings.debounce_ms / 1000)
                if marker.cancelled():
                    return []  # a newer request for this document came in while we waited
            request = self._request(settings, uri, document, context, candidates)
            divergence = self._divergence(settings, uri, source, context.offset, request)
            if divergence is not None:
                request = refine_request(request, divergence, settings.refine_steps)
            answer = await self._ask(
                request, document.language_id or "", not automatic, marker, settings.min_confidence, scored
            )
        finally:
            marker.cancel()  # nothing sent, or the call owns the document now: the marker leaves
        current = session.open_document(uri)
        if answer is None or current is None or current.version != context.version:
            return []  # no answer, or the document changed while the model worked: the result is stale
        found: list[tuple[InfillContext, Scored]] = []
        for edit in answer:
            text = None if edit is None else edit.text if divergence is None else refined(divergence, edit.text)
            if edit is None or text is None or any(text == other.text for _, other in found):
                continue
            end = position_after(context, edit.replaced(context.suffix)) if edit.replace_to_eol else None
            found.append((attrs.evolve(context, replace_end=end), edit.scored if divergence is None else Scored(text)))
        if divergence is not None and not found:  # the refine left nothing after the typed text: ask anew at once
            logger.info("the refine in %s kept nothing after the typed text: asking a new completion", uri)
            anew = attrs.evolve(settings, refine_steps=0, debounce_ms=0)
            return await self.complete(anew, uri, position, automatic, scored=scored)
        if found:
            session.shown.remember(uri, source, context.offset, found[0][1].text, found[0][1].confidence)
        return found

    def _divergence(
        self, settings: Settings, uri: str, source: str, offset: int, request: protocol.Infill
    ) -> Divergence | None:
        """What the user typed into the suggestion shown in ``uri`` that it does not start with, to refine
        (``refine.py``); None when refining is off, the request asks for several candidates, nothing diverged, or the
        backend cannot start a canvas from text (a completions server: it would answer the rewrite from noise)."""
        shown = self.session.shown.last(uri)
        if not settings.refine_steps or request.candidates != 1 or shown is None:
            return None
        divergence = diverged(shown, source, offset)
        backend = self.session.backend()
        if divergence is None or backend is None:
            return None
        refine = refine_request(request, divergence, settings.refine_steps)
        try:
            return divergence if backend.as_rewrite(refine) == refine else None
        except RewriteUnsupported:
            return None

    def _refused(self, reason: str, automatic: bool) -> list[tuple[InfillContext, Scored]]:
        """No completion, for ``reason``: the user who invoked it is told why (an automatic one stays quiet)."""
        if not automatic:
            self.session.show_info(f"diffgemma: no completion: {reason}")
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
            extra=self.session.extra_chunks(settings, uri, context.position.line, context.position.character),
            language_id=document.language_id or "",
            doc_version=context.version or 0,
            canvas_length=settings.canvas_length,
            max_steps=settings.steps,
            deadline_ms=settings.deadline_ms,
            scope=protocol.cursor_scope(context.prefix),
            candidates=candidates,
        )

    async def _ask(
        self,
        request: protocol.Infill,
        language_id: str,
        explicit: bool,
        marker: asyncio.Future[object],
        min_confidence: float = 0.0,
        scored: bool = False,
    ) -> list[Edit | None] | None:
        """``request`` under the backend's next id, in the place of ``marker`` (the request's hold on its document):
        a newer request for its ``uri`` cancels this one in the backend too. Its candidates post-processed
        (``infill_edits``, cut to what the model is sure of); None when there is nothing to show. A user who asked is
        told when the model was too unsure of the suggestion's start to show it."""
        session = self.session
        backend = session.backend()
        if backend is None or marker.cancelled():
            return None
        request = attrs.evolve(request, id=backend.new_id())
        reply = await session.ask(backend, request, Kind.COMPLETION, explicit=explicit)
        if reply.result is None:
            return None
        self.last_latency_ms, self.last_timings = reply.latency_ms, reply.result.timings
        if reply.engine_stopped or not reply.result.text:
            return None
        edits = infill_edits(backend.layout, request, reply.result, language_id, min_confidence, scored=scored)
        if explicit and not any(edits) and edits.withheld is not None:
            session.show_info(f"diffgemma: no completion: {edits.withheld}")
        return edits
