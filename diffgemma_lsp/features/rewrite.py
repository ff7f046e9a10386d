"""Rewrite selection, from the command's argument to the edit applied: read the selection, wait for a backend that is
still loading, ask it to start its canvas from the selection (a newer rewrite of the document supersedes it),
post-process the replacement, check the version once more and send ``workspace/applyEdit``.

``code_action`` offers the command on a selection; ``parse_arguments`` reads its argument; ``Rewrites.run`` answers
the command: ``{"applied", "reason"}``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

import attrs
from lsprotocol import types
from lsprotocol.validators import INTEGER_MAX_VALUE, INTEGER_MIN_VALUE, UINTEGER_MAX_VALUE
from pygls.exceptions import JsonRpcException, JsonRpcInvalidParams
from pygls.workspace import TextDocument

from diffgemma_engine.shared import protocol
from diffgemma_lsp.backend_link import WAIT_CANCELLED
from diffgemma_lsp.backends.base import Backend, RewriteUnsupported
from diffgemma_lsp.context import PositionError, clamp_position
from diffgemma_lsp.features.selection import (
    Selection,
    build_request,
    computed_on,
    read_selection,
    versioned_edit,
)
from diffgemma_lsp.owners import Kind, superseded
from diffgemma_lsp.params import invalid_params, lsp_integer
from diffgemma_lsp.postprocess.confidence import Scored, per_character, why_refused
from diffgemma_lsp.postprocess.replacement import scored_replacement
from diffgemma_lsp.session import Failure, Reply, Sent, Session
from diffgemma_lsp.settings import Settings

logger = logging.getLogger(__name__)

REWRITE_COMMAND = "diffgemma.rewriteSelection"
TITLE = "Rewrite selection"
KIND = types.CodeActionKind.RefactorRewrite

DISABLED = "rewrites are off (setting rewriteEnabled)"
STALE = "the document changed while its selection was being rewritten: nothing was changed; rewrite it again"
SUPERSEDED = superseded(Kind.REWRITE)
CANCELLED = "cancelled"
PRIVATE = "no rewrite: nothing of this file is sent to the model"
EMPTY = "the model's answer left nothing to put in the selection's place"
UNCHANGED = "the model wrote the selection as it was"
NO_BACKEND = "no backend to ask (see the settings)"
NO_EDITS = "the editor takes no edits from the server (workspace/applyEdit)"
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


def _fail(message: str) -> JsonRpcInvalidParams:
    return invalid_params(REWRITE_COMMAND, message)


def _position(raw: object, name: str) -> types.Position:
    if not isinstance(raw, Mapping):
        raise _fail(f"range.{name} must be a position {{line, character}}, got {raw!r}")
    line, character = (raw.get(key) for key in ("line", "character"))
    if not (lsp_integer(line, 0, UINTEGER_MAX_VALUE) and lsp_integer(character, 0, UINTEGER_MAX_VALUE)):
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
    if not lsp_integer(version, INTEGER_MIN_VALUE, INTEGER_MAX_VALUE):
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


def replacement_edit(selection: Selection, new_text: str, versioned: bool) -> types.WorkspaceEdit:
    """One edit replacing exactly the selection, for its version where the client takes versioned edits."""
    edit = types.TextEdit(range=selection.range, new_text=new_text)
    return versioned_edit(selection.uri, selection.version, [edit], versioned)


class Rewrite:
    """One rewrite in flight: its selection and the request sent for it."""

    def __init__(self, selection: Selection, backend: Backend, versioned: bool, min_confidence: float = 0.0) -> None:
        self.selection = selection
        self.backend = backend
        self.versioned = versioned
        """Whether the client takes versioned edits (``documentChanges``)."""
        self.min_confidence = min_confidence
        """A replacement the model is less sure of than this, on average, is not applied (``minConfidence``)."""
        self.sent: Sent | None = None
        self.stopped: str | None = None
        """Why the call was stopped (superseded, cancelled, closed), or None."""

    def stop(self, reason: str) -> None:
        """Stop the backend's work; the outcome says ``reason``."""
        if self.sent is not None and self.stopped is None and not self.sent.call.done():
            self.stopped = reason
            self.sent.call.cancel()

    def outcome(self, reply: Reply) -> Outcome:
        """The edit for the backend's ``reply``, or why there is none."""
        if reply.failure is Failure.STOPPED:
            return Outcome(reason=self.stopped or CANCELLED)
        if reply.failure is Failure.REFUSED:
            return Outcome(reason=f"the engine refused the rewrite: {reply.message}", show=types.MessageType.Warning)
        if reply.result is None:
            return Outcome(reason=f"no rewrite: {reply.message}", show=types.MessageType.Warning)
        if reply.engine_stopped:
            return Outcome(reason=f"the engine stopped the rewrite ({reply.result.stop.value})")
        selection, raw = self.selection, reply.result.text
        scored = scored_replacement(
            selection.prefix,
            selection.text,
            selection.suffix,
            Scored(raw, per_character(raw, reply.result.confidence)),
            selection.language_id,
            instruct=self.backend.layout is protocol.Layout.CHAT,
        )
        if scored is None:
            return Outcome(reason=EMPTY, show=types.MessageType.Info)
        text = scored.text
        if text != selection.text and (unsure := why_refused(scored, self.min_confidence)) is not None:
            return Outcome(reason=unsure, show=types.MessageType.Warning)
        if text == selection.text:
            return Outcome(reason=UNCHANGED, show=types.MessageType.Info)
        refilled = self.sent is not None and not self.sent.request.start  # written anew, not from the selection
        return Outcome(reason=REFILLED if refilled else "", edit=replacement_edit(selection, text, self.versioned))


class Rewrites:
    """Rewrite selection over the session: one rewrite per document in flight (the session's map)."""

    def __init__(self, session: Session) -> None:
        self.session = session

    def start(self, settings: Settings, args: RewriteArguments, versioned: bool) -> Rewrite | Outcome:
        """Send the rewrite ``args`` asks for, or say why not; InvalidParams for a document that is not open or a
        selection that is not one."""
        session = self.session
        document = session.open_document(args.uri)
        if document is None:
            raise _fail(f"{args.uri} is not open: send textDocument/didOpen first")
        selection = read_selection(document, args.range, settings.context_tokens, REWRITE_COMMAND)
        if not settings.rewrite_enabled:
            return Outcome(reason=DISABLED, show=types.MessageType.Info)
        if (private := session.refusal(args.uri, selection.prefix, selection.text, selection.suffix)) is not None:
            return Outcome(reason=f"{PRIVATE}: {private}", show=types.MessageType.Info)
        if args.version != selection.version:
            return Outcome(reason=STALE, show=types.MessageType.Warning)
        backend = session.backend()
        if backend is None:
            return Outcome(reason=NO_BACKEND, show=types.MessageType.Warning)
        chunks = session.extra_chunks(settings, args.uri, args.range.start.line)
        request = build_request(selection, settings, args.instruction, chunks, backend.new_id())
        try:
            request = backend.as_rewrite(request)
        except RewriteUnsupported as exc:
            return Outcome(reason=str(exc), show=types.MessageType.Warning)
        rewrite = Rewrite(selection, backend, versioned, settings.min_confidence)
        # the user asked: whatever was in flight for the document stops (a completion's answer would be stale)
        rewrite.sent = session.send(backend, request, Kind.REWRITE, stop=rewrite.stop)
        assert rewrite.sent is not None  # nothing outranks a rewrite
        return rewrite

    async def run(self, settings: Settings, args: RewriteArguments) -> dict[str, object]:
        """The command: rewrite the selection ``args`` names and apply the result as one edit, saying why not where
        it is not (``{"applied", "reason"}``). The progress it shows can be cancelled; an edit computed for a version
        the document has left is never applied."""
        session = self.session
        can_apply, versioned = session.edit_support()
        if not can_apply:
            return await self._apply(None, Outcome(reason=NO_EDITS, show=types.MessageType.Warning))
        link = session.link
        if link is not None and settings.rewrite_enabled and session.open_document(args.uri) is not None:
            if (gave_up := await link.until_ready()) is not None:  # starting or loading: wait for it
                show = None if gave_up.reason == WAIT_CANCELLED else types.MessageType.Warning
                return await self._apply(None, Outcome(reason=f"no rewrite: {gave_up.reason}", show=show))
        started = self.start(settings, args, versioned)
        if isinstance(started, Outcome):
            return await self._apply(None, started)
        assert link is not None and started.sent is not None  # a backend was started
        try:
            async with link.cancellable_progress("Rewriting the selection", lambda: started.stop(CANCELLED)):
                reply = await session.reply(started.sent)
        finally:
            started.stop(CANCELLED)  # no-op once answered; stops the work if this request was cancelled
        if (result := reply.result) is not None:
            timings = result.timings
            steps, tokens = timings.steps, timings.new_tokens
            logger.info("rewrite %s: %s, %d steps, %d tokens", result.id, result.stop.value, steps, tokens)
        return await self._apply(started, started.outcome(reply))

    async def _apply(self, rewrite: Rewrite | None, outcome: Outcome) -> dict[str, object]:
        """Apply the rewrite's edit unless the document changed meanwhile (checked right before it is sent: the
        edit's version lets the client refuse it too); tell the user what needs telling; the command's result."""
        session = self.session
        edit = outcome.edit if rewrite is not None else None
        if edit is not None and rewrite is not None:
            if not computed_on(rewrite.selection, session.open_document(rewrite.selection.uri)):
                edit, outcome = None, Outcome(reason=STALE, show=types.MessageType.Warning)
        applied = False
        client = session.client
        if edit is not None and client is not None:
            try:
                result = await client.workspace_apply_edit_async(types.ApplyWorkspaceEditParams(edit=edit, label=TITLE))
                applied, why = result.applied, result.failure_reason or "no reason given"
            except JsonRpcException as exc:
                why = str(exc)
            if not applied:
                outcome = Outcome(reason=f"the editor did not apply the edit: {why}", show=types.MessageType.Warning)
        if outcome.show is not None and client is not None:
            message = f"diffgemma: {outcome.reason}"
            client.window_show_message(types.ShowMessageParams(type=outcome.show, message=message))
        return outcome.answer(applied)
