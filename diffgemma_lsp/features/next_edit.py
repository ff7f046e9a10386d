"""Next-edit suggestions over LSP (issue 29, its language-server half): ``diffgemma/nextEdit`` and the "Apply
suggested edit" code action.

A next edit is a rewrite of an editable window of whole lines around the cursor (``nextEditLines`` above and
below, fewer where the model's canvas holds less) with the recent edits in the prompt
(``diffgemma_lsp.edit_history``): the canvas starts from the code that is there with a small share renoised
(``nextEditStrength``), so that most of the window is kept, and the model sees the code after the window as well
as before it. The answer is diffed line by line into ``TextEdit``s inside the window, in the document's positions,
for the version asked; a window that comes back as it was is "no edit" (``null``), and so is an answer computed
for a document that has changed since. The last suggestion per document is kept for the code action, which editors
without a custom UI (Helix) offer on the cursor.

The server computes a suggestion by itself at once when a change applies the last suggestion (the user accepted
it), and with ``nextEditOnPause`` when a burst of editing ends (``BURST_GAP_S`` without a change, and no completion
or rewrite in flight or completion on screen there); a request for that version near it takes it, and the code
action offers it, so editors that never ask (Helix, Zed) get next edits too.

After a rename (issue 45, next edits that jump), the other uses of the old name in the document are the places it
implies (``diffgemma_lsp.jumps``). When none lies in the window at the cursor, their one-line windows go to the
engine in one request, denoised in one batch; the first place's suggestion is the answer (with ``"jump": true``: the
editor takes the user there), and each one accepted offers the next at once, computed already (``Chain``). A place
whose line is longer than a canvas is left out; the others go.

"No edit" is also the answer when the model is not sure: the engine draws ``nextEditDraws`` canvases in one batch and
an edit is suggested only when they all write it. Measured against the canvas's entropy (``benchmarks/README.md``),
the draws' agreement is what separated real edits from noise.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

import attrs
from lsprotocol import types
from lsprotocol.converters import get_converter
from pygls.exceptions import JsonRpcInvalidParams
from pygls.workspace import TextDocument

from diffgemma_engine.shared import protocol
from diffgemma_lsp.backends.base import Backend, RewriteUnsupported
from diffgemma_lsp.context import PositionError
from diffgemma_lsp.document import split_lines
from diffgemma_lsp.edit_history import BURST_GAP_S
from diffgemma_lsp.features.selection import (
    Selection,
    applied,
    build_request,
    canvas_chars,
    computed_on,
    edit_window,
    fits,
    holds,
    line_edits,
    read_selection,
    versioned_edit,
)
from diffgemma_lsp.jumps import CHAIN_WINDOW_LINES, Chain, Place, chain_request, chain_settings, implied
from diffgemma_lsp.next_edit_notice import UNSURE_NOTICE_AFTER, unsure_notice
from diffgemma_lsp.owners import Kind
from diffgemma_lsp.params import NextEditArguments, next_edit_invalid, parse_arguments
from diffgemma_lsp.postprocess import postprocess_replacement
from diffgemma_lsp.session import Session
from diffgemma_lsp.settings import Settings

logger = logging.getLogger(__name__)

APPLY_TITLE = "Apply suggested edit"
APPLY_KIND = f"{types.CodeActionKind.RefactorRewrite.value}.nextEdit"
NEXT_EDIT_INSTRUCTION = (
    "Continue the user's recent edits in this code: make the change they call for here (for example the other uses "
    "of a renamed name), and keep everything else exactly as it is. If nothing follows from them, write the code "
    "unchanged."
)
"""What an instruction model is asked (FIM models see the window and the edits alone)."""


def next_edit_request(
    document: TextDocument,
    line: int,
    settings: Settings,
    canvas_tokens: int,
    extra: Sequence[protocol.Chunk],
    request_id: str,
) -> tuple[Selection, protocol.Infill] | None:
    """The window around ``line`` (``nextEditLines`` each way, fitted to a canvas of ``canvas_tokens``, 0: not known)
    and the rewrite of it that asks for the next edit, with ``extra`` (the recent edits among them) in the prompt;
    None for an empty document."""
    max_chars = canvas_chars(canvas_tokens)
    try:
        window = read_selection(
            document, edit_window(document, line, settings.next_edit_lines, max_chars), settings.context_tokens
        )
    except (JsonRpcInvalidParams, PositionError):
        return None
    request = build_request(window, settings, NEXT_EDIT_INSTRUCTION, extra, request_id, settings.next_edit_strength)
    return window, attrs.evolve(request, candidates=settings.next_edit_draws)


def suggested_window(window: Selection, answers: Sequence[str], instruct: bool) -> str | None:
    """The window as the engine's ``answers`` rewrite it (its draws: the first, then the others that differ from it),
    each post-processed as a rewrite's replacement is (``instruct``: an instruction model's answers); None when that
    is no edit, or when the draws do not all come to the same window (the model is not sure of an edit: measured,
    this is what sets a model's real next edits apart from its noise, see ``nextEditDraws`` in the README)."""
    windows = {
        postprocess_replacement(
            window.prefix, window.text, window.suffix, answer, window.language_id, instruct=instruct
        )
        for answer in answers
    }
    text = windows.pop() if len(windows) == 1 else None
    return None if text is None or text == window.text else text


@attrs.frozen(kw_only=True)
class Suggestion:
    """A next edit computed for one version of a document's text."""

    window: Selection
    edits: list[types.TextEdit]
    result: str
    """The document's text once the edits are applied: a change that makes it so is the suggestion accepted."""

    def answer(self, cursor: types.Position) -> dict[str, object]:
        """The request's result: ``{"uri", "version", "edits"}``, and ``"jump": true`` when the edit lies outside
        the window at ``cursor`` (a chain's next place: the editor takes the user there)."""
        edits = get_converter().unstructure(self.edits, list[types.TextEdit])
        answer: dict[str, object] = {"uri": self.window.uri, "version": self.window.version, "edits": edits}
        return answer | ({"jump": True} if not _inside(cursor, self.window.range) else {})

    def workspace_edit(self, versioned: bool) -> types.WorkspaceEdit:
        """The edits as one workspace edit: for this version only where the client takes versioned edits."""
        return versioned_edit(self.window.uri, self.window.version, list(self.edits), versioned)


def _suggestion(window: Selection, text: str, lines: Sequence[str]) -> Suggestion | None:
    """The suggestion that makes ``window`` (of the document of ``lines``) ``text``; None when nothing changes."""
    edits = line_edits(window, text)
    return Suggestion(window=window, edits=edits, result=applied(lines, window.range, text)) if edits else None


def _place(window: Selection, text: str) -> Place:
    """A chain's later place: ``window``, which the model makes ``text``."""
    first = window.range.start.line
    return Place(first=first, end=first + len(split_lines(window.text)), old=window.text, new=text)


def _inside(position: types.Position, window: types.Range) -> bool:
    start, end = window.start, window.end
    return (start.line, start.character) <= (position.line, position.character) <= (end.line, end.character)


class Interrupted(Exception):
    """The engine answered a next edit as cancelled or superseded: not an answer about the code."""


def _settled(task: asyncio.Task[Suggestion | None]) -> None:
    """A next edit computed ahead has ended: its error, if nobody asked for it, is logged here (once)."""
    if not task.cancelled() and (error := task.exception()) is not None and not isinstance(error, Interrupted):
        logger.warning("next edit computed ahead failed: %s", error)


@attrs.frozen(kw_only=True)
class Prefetch:
    """The next edit being computed, before it is asked for, for one version of a document after a suggestion
    was accepted."""

    version: int
    source: str = attrs.field(repr=False)
    """The document's text it is computed on: only a request for this very text takes it."""
    line: int
    """Where the accepted edit ended: a request near it (within the window's reach) takes this one."""
    task: asyncio.Task[Suggestion | None]


class NextEdits:
    """Suggests next edits over the session; keeps the last one per document, and computes the one after it as soon
    as it is accepted."""

    def __init__(self, session: Session) -> None:
        self.session = session
        self.ready: dict[str, Suggestion] = {}
        """Per document uri, the last suggestion (offered by the code action while the text is the same)."""
        self.prefetched: dict[str, Prefetch] = {}
        """Per document uri, the suggestion computed after the last one was accepted."""
        self._bursts: dict[str, asyncio.TimerHandle] = {}
        """Per document uri being edited, the call that asks for a next edit once the burst ends."""
        self._awaiting: dict[str, int] = {}
        """Per document uri with a fresh suggestion, the changes left that may apply it (an editor may send one per
        edit): after them the text is compared no more."""
        self._unsure = 0
        """Next edits the draws disagreed on since the last one suggested."""
        self._told_unsure = False
        """Whether the user was told why no next edit appears (once per server)."""
        self.chains: dict[str, Chain] = {}
        """Per document uri, the chain its last suggestion belongs to: the later places, computed already."""

    def forget(self, uri: str) -> None:
        """A document closed or opened anew: its suggestion, and what is computed ahead for it, go."""
        self.ready.pop(uri, None)
        self.chains.pop(uri, None)
        self._awaiting.pop(uri, None)
        if (pending := self._bursts.pop(uri, None)) is not None:
            pending.cancel()
        self._drop_prefetch(uri)

    def _drop_prefetch(self, uri: str) -> None:
        if (prefetch := self.prefetched.pop(uri, None)) is not None:
            prefetch.task.cancel()

    def changed(self, settings: Settings, uri: str, line: int) -> None:
        """The document ``uri`` changed at ``line``: a suggestion computed before is stale. If the change applied
        the last suggestion (the user accepted it), the next one is computed at once, before the editor asks;
        otherwise, with ``nextEditOnPause``, once the burst of editing ends (``BURST_GAP_S`` without a change), so
        that editors that never ask (Helix, Zed) offer it as a code action."""
        self._drop_prefetch(uri)
        if (pending := self._bursts.pop(uri, None)) is not None:
            pending.cancel()
        document = self.session.open_document(uri)
        if document is None or not settings.next_edit_enabled:
            return
        chain = self.chains.pop(uri, None)  # a change of the user's own ends it
        if self._accepted(uri, document):
            if chain is not None:
                self._next_place(settings, uri, document, chain)
                return
            last = self.ready[uri].edits[-1]
            line = last.range.start.line + len(split_lines(last.new_text))  # the line after the accepted change
            logger.info("next edit accepted in %s: computing the one after it", uri)
            self._prefetch(settings, uri, document, line)
            return
        if settings.next_edit_on_pause:
            self._bursts[uri] = asyncio.get_running_loop().call_later(
                BURST_GAP_S, self._burst_ended, settings, uri, document.version, line
            )

    def _accepted(self, uri: str, document: TextDocument) -> bool:
        """Whether the document is now the last suggestion applied (an editor may apply it in several changes)."""
        left = self._awaiting.pop(uri, 0)
        suggestion = self.ready.get(uri)
        if suggestion is None or not left:
            return False
        if document.source == suggestion.result:
            return True
        if left > 1:
            self._awaiting[uri] = left - 1
        return False

    def _next_place(self, settings: Settings, uri: str, document: TextDocument, chain: Chain) -> None:
        """An edit of ``chain`` was accepted: its next place that still holds what it held is offered, computed
        already (no engine request)."""
        accepted = self.ready[uri]
        chain.accepted(accepted.window.range.start.line, len(document.lines) - len(split_lines(accepted.window.source)))
        while (place := chain.next_place(document.lines)) is not None:
            window_range = edit_window(document, place.first, CHAIN_WINDOW_LINES)
            window = read_selection(document, window_range, settings.context_tokens)
            suggestion = _suggestion(window, place.new, document.lines)
            if window.text == place.old and suggestion is not None:
                logger.info(
                    "next edit accepted in %s: the chain's next place (line %d) computed already", uri, place.first
                )
                self.chains[uri] = chain
                self._offer(uri, suggestion)
                return
        logger.info("next edit accepted in %s: the chain of places is done", uri)

    def _burst_ended(self, settings: Settings, uri: str, version: int | None, line: int) -> None:
        self._bursts.pop(uri, None)
        document = self.session.open_document(uri)
        if document is None or document.version != version:
            return  # changed since
        if self.session.shown.showing(uri, document.source):
            return  # a completion is on screen there: one suggestion at a time
        self._prefetch(settings, uri, document, line)

    def _prefetch(self, settings: Settings, uri: str, document: TextDocument, line: int) -> None:
        line = min(line, max(len(document.lines) - 1, 0))
        version = document.version or 0
        arguments = NextEditArguments(uri=uri, version=version, position=types.Position(line=line, character=0))
        task = asyncio.ensure_future(self._compute(settings, arguments))
        task.add_done_callback(_settled)
        self.prefetched[uri] = Prefetch(version=version, source=document.source, line=line, task=task)

    async def request(self, settings: Settings, params: object) -> dict[str, object] | None:
        """``diffgemma/nextEdit``: the edit that follows the recent ones, in a window around the position, for the
        version asked (``{"uri", "version", "edits"}``, ``"jump"`` for a place away from the cursor), or null when
        there is none; waits for an engine that is still loading, as an explicit request does."""
        arguments = parse_arguments(params)
        link = self.session.link
        if link is not None and settings.next_edit_enabled and self.session.open_document(arguments.uri) is not None:
            if (gave_up := await link.until_ready()) is not None:
                link.gave_up_waiting("next edit", gave_up)
                return None
        suggestion = await self.suggest(settings, arguments)
        return suggestion.answer(arguments.position) if suggestion is not None else None

    async def suggest(self, settings: Settings, args: NextEditArguments) -> Suggestion | None:
        """The next edit at ``args.position``, or None: off, another version, a document not edited since it was
        opened, no backend or one that cannot rewrite, the engine's refusal, a window that came back unchanged, a
        document that changed meanwhile. InvalidParams for a document that is not open. A suggestion computed ahead
        for this version near this position (after the last one was accepted) is the answer, waited for if it is
        still being computed, and so is a chain's next place, offered when the last was accepted."""
        ready = self.ready.get(args.uri)
        if (
            args.uri in self.chains
            and ready is not None
            and computed_on(ready.window, self.session.open_document(args.uri))
        ):
            return ready
        prefetch = self.prefetched.get(args.uri)
        if prefetch is not None:
            document = self.session.open_document(args.uri)
            near = abs(prefetch.line - args.position.line) <= settings.next_edit_lines
            if near and prefetch.version == args.version and holds(document, prefetch.version, prefetch.source):
                try:
                    found = await asyncio.shield(prefetch.task)
                except Interrupted:  # superseded in the engine (a completion went first): computed anew below
                    pass
                else:
                    if found is not None:
                        self._offer(args.uri, found)
                    return found
            self._drop_prefetch(args.uri)
        try:
            return await self._compute(settings, args)
        except Interrupted:
            return None

    async def _compute(self, settings: Settings, args: NextEditArguments) -> Suggestion | None:
        """The next edit at ``args.position`` (see :meth:`suggest`), or at the places the last edit implies (a
        chain: the first is the answer, the others kept for the Tabs to come); ``Interrupted`` when it was not sent,
        or was cancelled or superseded (here or in the engine)."""
        session = self.session
        document = session.open_document(args.uri)
        if document is None:
            raise next_edit_invalid(f"{args.uri} is not open: send textDocument/didOpen first")
        if not settings.next_edit_enabled or (document.version or 0) != args.version:
            return None
        if not session.history.edited(args.uri):
            return None  # nothing the user did calls for an edit: the model is not asked
        backend = session.backend()
        if backend is None:
            return None
        places_now = implied(session.history.last_edit(args.uri, document.lines), document.lines)
        near = edit_window(document, args.position.line, settings.next_edit_lines)
        if any(near.start.line <= line < near.end.line + (near.end.character > 0) for line in places_now):
            places_now = []  # a use within the window at the cursor: that window is asked, as before chains
        asked = self._windows(settings, args, document, backend, places_now)
        if asked is None:
            return None
        windows, request = asked
        try:
            request = backend.as_rewrite(request)
        except RewriteUnsupported as exc:
            logger.info("no next edit for %s: %s", args.uri, exc)
            return None
        reply = await session.ask(backend, request, Kind.NEXT_EDIT)
        if reply.interrupted:  # a completion or a rewrite of the document went first
            raise Interrupted(reply.failure.value if reply.failure is not None else "stopped by the engine")
        if reply.result is None:
            return None  # timed out, unavailable or refused (logged)
        found = self._suggested(backend, settings, windows, reply.result)
        if not found or not computed_on(windows[0], session.open_document(args.uri)):
            return None
        self._unsure = 0
        (window, text), *later = found
        if (suggestion := _suggestion(window, text, document.lines)) is None:
            return None
        if places_now:
            logger.info("next edit in %s: a chain of %d places from request %s", args.uri, len(found), request.id)
            self.chains[args.uri] = Chain([_place(other, new) for other, new in later])
        self._offer(args.uri, suggestion)
        return suggestion

    def _windows(
        self, settings: Settings, args: NextEditArguments, document: TextDocument, backend: Backend, lines: list[int]
    ) -> tuple[list[Selection], protocol.Infill] | None:
        """The windows to rewrite (the places ``lines``, each its line, those that fit a canvas; none: the window at
        the cursor) and the one request that asks for them all; None for an empty document, no window that fits, or
        a window the privacy rules keep out (a secret document, or a secret in any window's text: nothing is sent)."""
        session = self.session
        extra = session.extra_chunks(settings, args.uri, args.position.line, args.position.character)
        canvas = settings.canvas_length or backend.canvas_length
        asked_with, request_id = (chain_settings(settings) if lines else settings), backend.new_id()
        asked = [
            next_edit_request(document, line, asked_with, canvas, extra, request_id)
            for line in lines or [args.position.line]
        ]
        pairs = [pair for pair in asked if pair is not None and fits(pair[0], canvas)]
        windows = [window for window, _ in pairs]
        if not pairs or any(session.refusal(args.uri, w.prefix, w.text, w.suffix) is not None for w in windows):
            return None
        return windows, chain_request([request for _, request in pairs])

    def _suggested(
        self, backend: Backend, settings: Settings, windows: list[Selection], result: protocol.Result
    ) -> list[tuple[Selection, str]]:
        """The windows the engine's answers change, with their new text, in order (the draws of each window must
        agree: ``suggested_window``)."""
        answers = [[result.text, *result.alternatives], *([each.text, *each.alternatives] for each in result.windows)]
        instruct = backend.layout is protocol.Layout.CHAT
        texts = [suggested_window(window, drawn, instruct) for window, drawn in zip(windows, answers, strict=False)]
        found = [(window, text) for window, text in zip(windows, texts, strict=False) if text is not None]
        if not found and any(len(drawn) > 1 for drawn in answers):  # the draws' texts that differ from the first
            self._draws_disagreed(backend.model_id, settings.next_edit_draws)
        return found

    def _draws_disagreed(self, model_id: str, draws: int) -> None:
        self._unsure += 1
        if self._unsure == UNSURE_NOTICE_AFTER and not self._told_unsure:
            self._told_unsure = True  # once per server
            self.session.show_info(unsure_notice(model_id, draws))

    def _offer(self, uri: str, suggestion: Suggestion) -> None:
        self.ready[uri] = suggestion
        self._awaiting[uri] = len(suggestion.edits)

    def code_action(
        self, document: TextDocument | None, params: types.CodeActionParams, versioned: bool
    ) -> types.CodeAction | None:
        """ "Apply suggested edit" when the last suggestion for the document is for its text as it is now and the
        cursor is in its window."""
        suggestion = self.ready.get(params.text_document.uri)
        if suggestion is None or not computed_on(suggestion.window, document):
            return None
        only = params.context.only
        if only is not None and not any(APPLY_KIND == kind or APPLY_KIND.startswith(f"{kind}.") for kind in only):
            return None
        title = APPLY_TITLE
        if not _inside(params.range.start, suggestion.window.range):
            if params.text_document.uri not in self.chains:
                return None
            title = f"{APPLY_TITLE} (line {suggestion.window.range.start.line + 1})"  # a chain's place: anywhere
        return types.CodeAction(title=title, kind=APPLY_KIND, edit=suggestion.workspace_edit(versioned))
