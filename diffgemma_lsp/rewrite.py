"""One rewrite of a selection, from the command's argument to the edit: read the selection, ask the backend to
start its canvas from it (latest wins per document), post-process the replacement, build the versioned edit.

``code_action`` offers the command on a selection; ``parse_arguments`` reads its argument; ``Rewriter`` holds the
rewrites in flight and turns each into an ``Outcome``: the edit to apply, or why there is none. The language
server shows the progress, checks the version once more and sends ``workspace/applyEdit`` (``server.py``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import TypeGuard

import attrs
from lsprotocol import types
from lsprotocol.validators import INTEGER_MAX_VALUE, INTEGER_MIN_VALUE, UINTEGER_MAX_VALUE
from pygls.exceptions import JsonRpcInvalidParams
from pygls.workspace import TextDocument

from diffgemma_engine.shared import protocol
from diffgemma_lsp.backends.base import Backend, EngineRequestError, EngineUnavailable, RewriteUnsupported
from diffgemma_lsp.completion import Completer
from diffgemma_lsp.context import PositionError, build_context, clamp_position
from diffgemma_lsp.owners import Kind
from diffgemma_lsp.postprocess import postprocess_replacement
from diffgemma_lsp.settings import Settings

logger = logging.getLogger(__name__)

REWRITE_COMMAND = "diffgemma.rewriteSelection"
TITLE = "Rewrite selection"
KIND = types.CodeActionKind.RefactorRewrite

DISABLED = "rewrites are off (setting rewriteEnabled)"
STALE = "the document changed while its selection was being rewritten: nothing was changed; rewrite it again"
SUPERSEDED = "superseded by a newer rewrite of this document"
CANCELLED = "cancelled"
CLOSED = "the document was closed"
REOPENED = "the document was opened anew"
PRIVATE = "no rewrite: nothing of this file is sent to the model"
EMPTY = "the model's answer left nothing to put in the selection's place"
UNCHANGED = "the model wrote the selection as it was"
NO_BACKEND = "no backend to ask (see the settings)"
REFILLED = "the backend cannot start from the selection: it was written anew between the code around it"


@attrs.frozen(kw_only=True)
class RewriteArguments:
    """The command's one argument object."""

    uri: str
    range: types.Range
    version: int
    """The document's version the selection was made in."""
    instruction: str = ""
    """What to do with the selection (an instruction model's prompt; FIM models ignore it)."""


@attrs.frozen(kw_only=True)
class Selection:
    """The selected text and the text around it, cut to the prompt budget."""

    uri: str
    range: types.Range
    """Clamped to the document (in the client's units)."""
    version: int
    text: str
    prefix: str
    """The text before the selection, cut to three quarters of the budget (as for a completion)."""
    suffix: str
    """The text after the selection, cut to a quarter of the budget."""
    language_id: str
    source: str = attrs.field(repr=False)
    """The document's whole text the selection was read from: the edit is for this text only."""


def computed_on(selection: Selection, document: TextDocument | None) -> bool:
    """Whether ``document`` holds the very text ``selection`` was read from, at its version (``holds``)."""
    return holds(document, selection.version, selection.source)


def holds(document: TextDocument | None, version: int, source: str) -> bool:
    """Whether ``document`` is at ``version`` and its text is ``source``. The version alone does not say so: a
    document opened again (closed and reopened, or a second ``didOpen``) starts its versions anew, and an edit for
    "version 1" would land on other text."""
    if document is None or (document.version or 0) != version:
        return False
    return document.source == source  # the same string object while unchanged: no comparison then


@attrs.frozen(kw_only=True)
class Outcome:
    """How a rewrite ended: an edit to apply, or why there is none."""

    reason: str = ""
    """Why nothing is applied, or a note on what was (``REFILLED``)."""
    edit: types.WorkspaceEdit | None = None
    show: types.MessageType | None = None
    """Whether to tell the user (a window/showMessage of ``reason``), and how loudly."""

    def answer(self, applied: bool) -> dict[str, object]:
        """The command's result."""
        return {"applied": applied, "reason": self.reason}


MAX_MESSAGE_CHARS = 400
"""An error message quotes at most this much of a bad argument."""


def _fail(message: str) -> JsonRpcInvalidParams:
    if len(message) > MAX_MESSAGE_CHARS:
        message = message[: MAX_MESSAGE_CHARS - 1] + "…"
    return JsonRpcInvalidParams(f"{REWRITE_COMMAND}: {message}")


def _integer(value: object, low: int, high: int) -> TypeGuard[int]:
    """Whether ``value`` is an integer (not a bool, not a float) from ``low`` to ``high``: LSP's ranges."""
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


def _position(raw: object, name: str) -> types.Position:
    if not isinstance(raw, Mapping):
        raise _fail(f"range.{name} must be a position {{line, character}}, got {raw!r}")
    line, character = (raw.get(key) for key in ("line", "character"))
    if not (_integer(line, 0, UINTEGER_MAX_VALUE) and _integer(character, 0, UINTEGER_MAX_VALUE)):
        raise _fail(
            f"range.{name} needs a line and a character, both integers from 0 to {UINTEGER_MAX_VALUE}, "
            f"got {dict(raw)!r}"
        )
    return types.Position(line=line, character=character)


def parse_arguments(args: Sequence[object]) -> RewriteArguments:
    """The command's argument, or an InvalidParams error that says what is wrong with it."""
    shape = "one argument object {uri, range, version, instruction?}"
    if len(args) != 1 or not isinstance(args[0], Mapping):
        raise _fail(f"takes {shape}, got {list(args)!r}"[:300])
    raw = args[0]
    uri, selected, version, instruction = (raw.get(key) for key in ("uri", "range", "version", "instruction"))
    if not isinstance(uri, str) or not uri:
        raise _fail(f"uri must be the document's URI, got {uri!r}")
    if not isinstance(selected, Mapping):
        raise _fail(f"range must be an LSP range {{start, end}}, got {selected!r}")
    if not _integer(version, INTEGER_MIN_VALUE, INTEGER_MAX_VALUE):
        limits = f"from {INTEGER_MIN_VALUE} to {INTEGER_MAX_VALUE}"
        raise _fail(f"version must be the document's version (an integer {limits}), got {version!r}")
    if not isinstance(instruction, str | None):
        raise _fail(f"instruction must be a string, got {instruction!r}")
    if instruction is not None and len(instruction) > protocol.MAX_INSTRUCTION_CHARS:
        limit = protocol.MAX_INSTRUCTION_CHARS
        raise _fail(f"the instruction is {len(instruction)} characters, more than {limit}: shorten it")
    start, end = _position(selected.get("start"), "start"), _position(selected.get("end"), "end")
    return RewriteArguments(
        uri=uri, range=types.Range(start=start, end=end), version=version, instruction=instruction or ""
    )


def _offers(only: Sequence[str] | None) -> bool:
    """Whether a code action request filtered to the kinds ``only`` takes ours (``refactor`` covers it)."""
    return only is None or any(not kind or KIND == kind or KIND.startswith(f"{kind}.") for kind in only)


def code_action(
    settings: Settings, document: TextDocument | None, params: types.CodeActionParams
) -> types.CodeAction | None:
    """The "Rewrite selection" action for a non-empty selection in an open document, when rewrites are on."""
    if not settings.rewrite_enabled or document is None or not _offers(params.context.only):
        return None
    try:
        start, end = (clamp_position(document, position) for position in (params.range.start, params.range.end))
    except PositionError:
        return None
    if (start.line, start.character) >= (end.line, end.character):
        return None
    argument = {
        "uri": params.text_document.uri,
        "range": {
            "start": {"line": start.line, "character": start.character},
            "end": {"line": end.line, "character": end.character},
        },
        "version": document.version or 0,
    }
    command = types.Command(title=TITLE, command=REWRITE_COMMAND, arguments=[argument])
    return types.CodeAction(title=TITLE, kind=KIND, command=command)


def read_selection(document: TextDocument, selected: types.Range, context_tokens: int) -> Selection:
    """The selection and the text around it; an InvalidParams error for a selection that is empty, reversed or
    not in the document (a character past its line's end counts as the line's end, as LSP says)."""
    try:
        before = build_context(document, selected.start, context_tokens)
        after = build_context(document, selected.end, context_tokens)
    except PositionError as exc:
        raise _fail(f"the selection is not in the document: {exc}") from None
    if after.offset < before.offset:
        raise _fail("the selection ends before it starts")
    if after.offset == before.offset:
        raise _fail("the selection is empty: select the code to rewrite")
    return Selection(
        uri=document.uri,
        range=types.Range(start=before.position, end=after.position),
        version=document.version or 0,
        text=document.source[before.offset : after.offset],
        prefix=before.prefix,
        suffix=after.suffix,
        language_id=document.language_id or "",
        source=document.source,
    )


def build_request(
    selection: Selection,
    settings: Settings,
    instruction: str,
    extra: Sequence[protocol.Chunk],
    request_id: str,
    strength: float | None = None,
) -> protocol.Infill:
    """The infill that rewrites ``selection``: its canvas starts from the selected text, ``strength`` of it renoised
    (default: ``rewriteStrength``), with no deadline (the user waits for it, and can cancel)."""
    return protocol.Infill(
        id=request_id,
        uri=selection.uri,
        prefix=selection.prefix,
        suffix=selection.suffix,
        language_id=selection.language_id,
        extra=list(extra),
        doc_version=selection.version,
        canvas_length=settings.canvas_length,
        max_steps=settings.rewrite_steps,
        start=[protocol.StartSegment(text=selection.text)],
        strength=settings.rewrite_strength if strength is None else strength,
        instruction=instruction,
    )


def replacement_edit(selection: Selection, new_text: str, versioned: bool) -> types.WorkspaceEdit:
    """One edit replacing exactly the selection: a ``TextDocumentEdit`` for its version (the client refuses it for
    another), or a plain change where the client takes no ``documentChanges``."""
    edit = types.TextEdit(range=selection.range, new_text=new_text)
    if not versioned:
        return types.WorkspaceEdit(changes={selection.uri: [edit]})
    document = types.OptionalVersionedTextDocumentIdentifier(uri=selection.uri, version=selection.version)
    return types.WorkspaceEdit(document_changes=[types.TextDocumentEdit(text_document=document, edits=[edit])])


class Rewrite:
    """One rewrite in flight: its selection, the request as sent, and the backend's call."""

    def __init__(
        self,
        selection: Selection,
        backend: Backend,
        request: protocol.Infill,
        versioned: bool,
        answered: Callable[[], None],
    ) -> None:
        self.selection = selection
        self.backend = backend
        self.request = request
        self.refilled = not request.start
        """The backend re-fills the span from noise instead of starting from the selection."""
        self.versioned = versioned
        """Whether the client takes versioned edits (``documentChanges``)."""
        self.answered = answered
        """Called when the backend has answered (with a result or a refusal)."""
        self.call: asyncio.Task[protocol.Result] = asyncio.ensure_future(backend.infill(request))
        self.stopped: str | None = None
        """Why the call was stopped (superseded, cancelled, closed), or None."""

    def stop(self, reason: str) -> None:
        """Stop the backend's work; the outcome says ``reason``."""
        if self.stopped is None and not self.call.done():
            self.stopped = reason
            self.call.cancel()

    async def outcome(self) -> Outcome:
        """The edit for the backend's answer, or why there is none. Cancelling the caller cancels the work."""
        try:
            result = await self.call
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if self.stopped is None or (current is not None and current.cancelling()):
                self.call.cancel()
                raise
            return Outcome(reason=self.stopped)
        except RewriteUnsupported as exc:
            return Outcome(reason=str(exc), show=types.MessageType.Warning)
        except EngineRequestError as exc:
            self.answered()
            return Outcome(
                reason=f"the engine refused the rewrite: {exc.error.message}", show=types.MessageType.Warning
            )
        except EngineUnavailable as exc:
            return Outcome(reason=f"no rewrite: {exc}", show=types.MessageType.Warning)
        self.answered()
        timings = result.timings
        logger.info(
            "rewrite %s: %s, %d steps, %d tokens", self.request.id, result.stop.value, timings.steps, timings.new_tokens
        )
        if result.stop in (protocol.StopReason.CANCELLED, protocol.StopReason.SUPERSEDED):
            return Outcome(reason=f"the engine stopped the rewrite ({result.stop.value})")
        selection = self.selection
        text = postprocess_replacement(
            selection.prefix,
            selection.text,
            selection.suffix,
            result.text,
            selection.language_id,
            instruct=self.backend.layout is protocol.Layout.CHAT,
        )
        if text is None:
            return Outcome(reason=EMPTY, show=types.MessageType.Info)
        if text == selection.text:
            return Outcome(reason=UNCHANGED, show=types.MessageType.Info)
        return Outcome(reason=REFILLED if self.refilled else "", edit=replacement_edit(selection, text, self.versioned))


class Rewriter:
    """The rewrites in flight, one per document: a newer one supersedes it. Uses the completer's backend, open
    documents and extra context."""

    def __init__(self, completer: Completer) -> None:
        self.completer = completer
        self.active: dict[str, Rewrite] = {}
        """Per document uri, the rewrite in flight, to stop it saying why (which request goes first is
        ``completer.owners``' to say)."""

    def stop(self, uri: str, reason: str) -> None:
        """Stop the rewrite of ``uri`` in flight, if any."""
        if (rewrite := self.active.pop(uri, None)) is not None:
            rewrite.stop(reason)

    def start(self, settings: Settings, args: RewriteArguments, versioned: bool) -> Rewrite | Outcome:
        """Send the rewrite ``args`` asks for, or say why not; InvalidParams for a document that is not open or a
        selection that is not one."""
        document = self.completer.open_document(args.uri)
        if document is None:
            raise _fail(f"{args.uri} is not open: send textDocument/didOpen first")
        selection = read_selection(document, args.range, settings.context_tokens)
        if not settings.rewrite_enabled:
            return Outcome(reason=DISABLED, show=types.MessageType.Info)
        if (
            private := self.completer.refusal(args.uri, selection.prefix, selection.text, selection.suffix)
        ) is not None:
            return Outcome(reason=f"{PRIVATE}: {private}", show=types.MessageType.Info)
        if args.version != selection.version:
            return Outcome(reason=STALE, show=types.MessageType.Warning)
        backend = self.completer.backend()
        if backend is None:
            return Outcome(reason=NO_BACKEND, show=types.MessageType.Warning)
        completer = self.completer
        chunks = completer.extra_chunks(settings, args.uri, args.range.start.line)
        request = build_request(selection, settings, args.instruction, chunks, backend.new_id())
        try:
            sent = backend.as_rewrite(request)
        except RewriteUnsupported as exc:
            return Outcome(reason=str(exc), show=types.MessageType.Warning)
        rewrite = self.active[args.uri] = Rewrite(selection, backend, sent, versioned, completer.answered)
        # the user asked: whatever was in flight for the document stops (a completion's answer would be stale)
        completer.owners.claim(args.uri, Kind.REWRITE, rewrite.call, lambda: rewrite.stop(SUPERSEDED))
        rewrite.call.add_done_callback(lambda _: self._done(args.uri, rewrite))
        return rewrite

    def _done(self, uri: str, rewrite: Rewrite) -> None:
        if self.active.get(uri) is rewrite:
            del self.active[uri]

    def still_current(self, rewrite: Rewrite) -> bool:
        """Whether the open document still holds the text the rewrite was computed from (``computed_on``)."""
        return computed_on(rewrite.selection, self.completer.open_document(rewrite.selection.uri))
