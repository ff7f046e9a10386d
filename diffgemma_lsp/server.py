"""The language server's LSP edge: the protocol override, settings, outage and progress reports, and thin
handlers for document sync, completion and inline completion (the core is ``completion.py``), and the "Rewrite
selection" code action and command (the core is ``rewrite.py``). Never imports torch."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import sys
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, BinaryIO
from urllib.parse import unquote

import attrs
from lsprotocol import types
from pygls.exceptions import JsonRpcException
from pygls.lsp.server import LanguageServer
from pygls.workspace import TextDocument

from diffgemma_engine.shared.urls import plain_http_elsewhere
from diffgemma_lsp import __version__, stdio
from diffgemma_lsp.backends.base import Backend, BackendState, EngineNotReady, EngineUnavailable
from diffgemma_lsp.backends.connect import connect
from diffgemma_lsp.completion import Completer
from diffgemma_lsp.document import LineDocument
from diffgemma_lsp.index_progress import IndexProgress
from diffgemma_lsp.jsonrpc import DiffgemmaProtocol
from diffgemma_lsp.next_edit import APPLY_KIND, NEXT_EDIT_METHOD, NextEdits
from diffgemma_lsp.next_edit import parse_arguments as parse_next_edit
from diffgemma_lsp.repo.grammars import LANGUAGE_OF_EXTENSION
from diffgemma_lsp.repo.live import path_of
from diffgemma_lsp.results import completion_item, inline_item
from diffgemma_lsp.rewrite import (
    CANCELLED,
    CLOSED,
    KIND,
    REOPENED,
    REWRITE_COMMAND,
    STALE,
    TITLE,
    Outcome,
    Rewrite,
    Rewriter,
    code_action,
    parse_arguments,
)
from diffgemma_lsp.settings import Settings, parse_settings

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


class DiffgemmaServer(LanguageServer):
    """Holds the settings, the backend and the completer."""

    def __init__(self, engine_socket: Path | None = None, model: str | None = None) -> None:
        super().__init__("diffgemma-lsp", __version__, protocol_cls=DiffgemmaProtocol)
        self.engine_socket = engine_socket
        """The engine to use (``--engine-socket``); None: the one for the model and device settings."""
        self.settings = Settings(model=model)
        self.cli_model = model
        self.backend: Backend | None = None
        """The local engine, or the remote OpenAI-compatible server (settings ``backend``)."""
        self.completer = Completer(self.start_backend, self.open_document, self.backend_answered)
        """The completion core: latest request per document, shown completions, extra context."""
        self.rewriter = Rewriter(self.completer)
        """The rewrites in flight, one per document."""
        self.next_edits = NextEdits(self.completer)
        """Next-edit suggestions: computed after a burst of edits or an accepted suggestion, one per document."""
        self.next_edits.notify = self.show_info
        self.completer.notify = self.show_info
        self.completer.repo.on_progress = IndexProgress(self, self._supports_progress)
        self._progress_token: str | None = None
        self._outage_reported = False
        self._backend_wait: asyncio.Future[None] | None = None
        """The wait for the backend that explicit requests share (one progress for all of them)."""
        self.initialized = False
        self._watching = False

    def start_io(self, stdin: BinaryIO | None = None, stdout: BinaryIO | None = None) -> None:
        """Serve on stdin and stdout, stdin read by the event loop (``diffgemma_lsp.stdio``), not a thread."""
        stdio.serve(self, stdin or sys.stdin.buffer, stdout or sys.stdout.buffer)

    def show_info(self, message: str) -> None:
        """Log ``message`` and show it to the user (``window/showMessage``, Info)."""
        logger.info("%s", message)
        self.window_show_message(types.ShowMessageParams(type=types.MessageType.Info, message=message))

    def report_server_error(self, error: Exception, source: Any) -> None:
        """Log server errors; never a popup for one bad message (pygls shows one by default)."""
        logger.error("server error (%s): %s", getattr(source, "__name__", source), error)

    # -- settings ----------------------------------------------------------------------------------------

    def apply_settings(self, raw: object) -> None:
        """Take new settings; report bad keys once and use their defaults."""
        settings, problems = parse_settings(raw)
        if settings.model is None and self.cli_model is not None:
            settings = attrs.evolve(settings, model=self.cli_model)
        previous, self.settings = self.settings, settings
        if self.backend is not None and previous.backend_key() != settings.backend_key():
            old, self.backend = self.backend, None  # the next completion connects to the new backend
            old.on_state = None  # its requests failing as it closes are not an outage to report
            asyncio.ensure_future(old.close())
        self.completer.repo.index.set_private_patterns(settings.private_files)  # what it names leaves the index
        if problems:
            message = "diffgemma: " + "; ".join(problems)
            logger.warning("%s", message)
            self.window_show_message(types.ShowMessageParams(type=types.MessageType.Warning, message=message))

    # -- workspace index ---------------------------------------------------------------------------------

    def start_index(self) -> None:
        """Index the workspace folders in the background (once each) while the workspace context is on, and ask
        the client, where it can, to report its source files' changes on disk."""
        folders = [folder.uri for folder in self.workspace.folders.values()]
        if not folders and self.workspace.root_uri:
            folders = [self.workspace.root_uri]
        roots = [Path(path) for uri in folders if (path := path_of(uri))]
        self.completer.privacy.add_roots(roots)  # a file outside them never goes into a prompt
        if not self.settings.repo_context_tokens:
            return
        self.completer.repo.start(roots)
        if not self._watching and self._can_watch_files():
            self._watching = True
            asyncio.ensure_future(self._watch_files())

    def _can_watch_files(self) -> bool:
        workspace = self.client_capabilities.workspace if self.client_capabilities else None
        watched = workspace.did_change_watched_files if workspace else None
        return bool(watched and watched.dynamic_registration)

    async def _watch_files(self) -> None:
        extensions = ",".join(sorted(extension.lstrip(".") for extension in LANGUAGE_OF_EXTENSION))
        options = types.DidChangeWatchedFilesRegistrationOptions(
            watchers=[types.FileSystemWatcher(glob_pattern=f"**/*.{{{extensions}}}")]
        )
        registration = types.Registration(
            id=f"diffgemma-watch-{uuid.uuid4().hex[:8]}",
            method=types.WORKSPACE_DID_CHANGE_WATCHED_FILES,
            register_options=options,
        )
        try:
            await self.client_register_capability_async(types.RegistrationParams(registrations=[registration]))
        except Exception:
            logger.info("the client does not watch files for the workspace index", exc_info=True)

    # -- backend -----------------------------------------------------------------------------------------

    def start_backend(self) -> Backend | None:
        """The backend, connected (the local engine started when none runs) the first time it is needed; None
        when the settings name none that can work (reported)."""
        if self.backend is None:
            settings = self.settings
            if settings.backend == "openai" and plain_http_elsewhere(settings.openai_url):
                message = (
                    f"diffgemma: completions send your code unencrypted to {settings.openai_url}; "
                    "use https:// (a TLS proxy in front of the server) unless this network is trusted"
                )
                logger.warning("%s", message)
                self.window_show_message(types.ShowMessageParams(type=types.MessageType.Warning, message=message))
            self.backend = connect(settings, self.engine_socket, self.on_backend_state)
        return self.backend

    def on_backend_state(self, state: BackendState, detail: str) -> None:
        """Show loading progress; report an outage once, and its end."""
        logger.info("engine %s%s", state.value, f": {detail}" if detail else "")
        if state in (BackendState.CONNECTING, BackendState.LOADING):
            self._begin_progress(
                "Loading the completion model"
                if state is BackendState.LOADING
                else "Connecting to the completion engine"
            )
        elif state is BackendState.READY:
            self._end_progress("Completion model ready")  # the outage ends with the first answer (backend_answered)
        elif state in (BackendState.FAILED, BackendState.DISCONNECTED) and detail and not self._outage_reported:
            self._outage_reported = True  # one message per outage, not one per keystroke
            self._end_progress(detail)
            self.window_show_message(
                types.ShowMessageParams(
                    type=types.MessageType.Warning,
                    message=f"diffgemma: {detail}. Completions are off until it is back.",
                )
            )

    async def until_backend_ready(self) -> GaveUp | None:
        """For an explicit request: wait while the backend starts or loads (at most ``ENGINE_WAIT_S``, with one
        cancellable progress shared by every request waiting). None once it can answer (or when there is no
        backend: the request says so itself); else why it gave up."""
        backend = self.start_backend()
        if backend is None or backend.state is BackendState.READY:
            return None
        if self._backend_wait is None or self._backend_wait.done():
            self._backend_wait = asyncio.ensure_future(self._show_backend_wait(backend))
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

    async def _show_backend_wait(self, backend: Backend) -> None:
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
            self.window_show_message(types.ShowMessageParams(type=types.MessageType.Warning, message=message))

    def backend_answered(self) -> None:
        """A request was answered: an outage reported before is over (an engine that accepts connections and
        drops them is not "back" until it answers, so it is reported once, not once per reconnection)."""
        if self._outage_reported:
            self.window_log_message(
                types.LogMessageParams(type=types.MessageType.Info, message="diffgemma: engine is back")
            )
        self._outage_reported = False

    def _supports_progress(self) -> bool:
        window = self.client_capabilities.window if self.client_capabilities else None
        return bool(window and window.work_done_progress)

    def _begin_progress(self, title: str) -> None:
        if self._progress_token is not None or not self._supports_progress():
            return
        token = self._progress_token = f"diffgemma-{uuid.uuid4().hex[:8]}"

        async def begin() -> None:
            try:
                await self.work_done_progress.create_async(token)
            except Exception:
                logger.debug("client refused work done progress", exc_info=True)
                return
            self.work_done_progress.begin(token, types.WorkDoneProgressBegin(title=title, cancellable=False))

        asyncio.ensure_future(begin())

    def _end_progress(self, message: str) -> None:
        token, self._progress_token = self._progress_token, None
        if token is not None:
            self.work_done_progress.tokens.pop(token, None)  # pygls keeps every token it was given (pygls #607)
            self.work_done_progress.end(token, types.WorkDoneProgressEnd(message=message))

    @contextlib.asynccontextmanager
    async def cancellable_progress(self, title: str, on_cancel: Callable[[], None]) -> AsyncIterator[None]:
        """Progress shown while the body runs, with a cancel button that calls ``on_cancel``; none where the client
        takes no server-initiated progress or refuses the token."""
        token: str | None = f"diffgemma-{uuid.uuid4().hex[:8]}" if self._supports_progress() else None
        if token is not None:
            try:
                async with asyncio.timeout(PROGRESS_CREATE_TIMEOUT_S):
                    await self.work_done_progress.create_async(token)
            except Exception:
                logger.debug("client refused work done progress", exc_info=True)
                token = None
        if token is not None:
            self.work_done_progress.begin(token, types.WorkDoneProgressBegin(title=title, cancellable=True))
            loop = asyncio.get_running_loop()
            cancelled = self.work_done_progress.tokens[token]  # pygls cancels it on window/workDoneProgress/cancel
            cancelled.add_done_callback(lambda future: future.cancelled() and loop.call_soon_threadsafe(on_cancel))
        try:
            yield
        finally:
            if token is not None:
                self.work_done_progress.tokens.pop(token, None)
                self.work_done_progress.end(token, types.WorkDoneProgressEnd())

    def edit_support(self) -> tuple[bool, bool]:
        """(whether the client applies edits the server sends, whether it takes versioned ones)."""
        workspace = self.client_capabilities.workspace if self.client_capabilities else None
        edits = workspace.workspace_edit if workspace else None
        return bool(workspace and workspace.apply_edit), bool(edits and edits.document_changes)

    async def apply_rewrite(self, rewrite: Rewrite | None, outcome: Outcome) -> dict[str, object]:
        """Apply the rewrite's edit unless the document changed meanwhile (checked right before it is sent: the
        edit's version lets the client refuse it too); tell the user what needs telling; the command's result."""
        edit = outcome.edit if rewrite is not None else None
        if edit is not None and rewrite is not None and not self.rewriter.still_current(rewrite):
            edit, outcome = None, Outcome(reason=STALE, show=types.MessageType.Warning)
        applied = False
        if edit is not None:
            try:
                result = await self.workspace_apply_edit_async(types.ApplyWorkspaceEditParams(edit=edit, label=TITLE))
                applied, why = result.applied, result.failure_reason or "no reason given"
            except JsonRpcException as exc:
                why = str(exc)
            if not applied:
                outcome = Outcome(reason=f"the editor did not apply the edit: {why}", show=types.MessageType.Warning)
        if outcome.show is not None:
            self.window_show_message(types.ShowMessageParams(type=outcome.show, message=f"diffgemma: {outcome.reason}"))
        return outcome.answer(applied)

    def open_document(self, uri: str) -> TextDocument | None:
        """The open document ``uri`` names, or None. pygls keeps documents under their unquoted URIs (it looks
        them up so too): ``file:///my%20project/a.py`` is the document opened under that URI."""
        document: TextDocument | None = self.workspace.text_documents.get(unquote(uri))
        return document


server = DiffgemmaServer()


def _snippet_support(ls: DiffgemmaServer) -> bool:
    caps = ls.client_capabilities.text_document if ls.client_capabilities else None
    item = caps.completion.completion_item if caps and caps.completion else None
    return bool(item and item.snippet_support)


@server.feature(types.INITIALIZE)
def initialize(ls: DiffgemmaServer, params: types.InitializeParams) -> None:
    """Read the settings from ``initializationOptions``."""
    ls.apply_settings(params.initialization_options)


@server.feature(types.INITIALIZED)
def initialized(ls: DiffgemmaServer, params: types.InitializedParams) -> None:
    """Connect to the engine, starting it when none runs (not while completions are disabled); index the
    workspace in the background, and ask the client to report its files' changes."""
    ls.initialized = True
    if ls.settings.enable:
        ls.start_backend()
    ls.start_index()


@server.feature(types.WORKSPACE_DID_CHANGE_CONFIGURATION)
def did_change_configuration(ls: DiffgemmaServer, params: types.DidChangeConfigurationParams) -> None:
    """Take the new settings."""
    ls.apply_settings(params.settings)
    if ls.initialized:
        ls.start_index()  # the workspace context turned on


@server.feature(types.WORKSPACE_DID_CHANGE_WORKSPACE_FOLDERS)
def did_change_workspace_folders(ls: DiffgemmaServer, params: types.DidChangeWorkspaceFoldersParams) -> None:
    """Index the folders added; forget those removed."""
    added = [Path(path) for folder in params.event.added if (path := path_of(folder.uri))]
    removed = [Path(path) for folder in params.event.removed if (path := path_of(folder.uri))]
    privacy = ls.completer.privacy
    privacy.set_roots([root for root in privacy.roots if root not in {path.resolve() for path in removed}] + added)
    if ls.settings.repo_context_tokens:
        ls.completer.repo.folders_changed(added, removed)


@server.feature(types.WORKSPACE_DID_CHANGE_WATCHED_FILES)
def did_change_watched_files(ls: DiffgemmaServer, params: types.DidChangeWatchedFilesParams) -> None:
    """Files created, changed or deleted on disk (by the editor's file watching): the index reads them again,
    except open documents (their text is what counts)."""
    if not ls.settings.repo_context_tokens:
        return
    for change in params.changes:
        if ls.open_document(change.uri) is None:
            ls.completer.repo.file_changed(change.uri, deleted=change.type == types.FileChangeType.Deleted)


@server.feature(
    types.TEXT_DOCUMENT_COMPLETION,
    types.CompletionOptions(resolve_provider=False, trigger_characters=[".", "(", " ", "\n"]),
)
async def completion(ls: DiffgemmaServer, params: types.CompletionParams) -> types.CompletionList | None:
    """One item carrying the whole multi-line completion as a text edit.

    Editors also ask for the menu as the user types, some of them as "invoked" (Helix), so the menu always
    costs one canvas; candidates to cycle through come from an invoked inline completion.
    """
    invoked = params.context is not None and params.context.trigger_kind == types.CompletionTriggerKind.Invoked
    if invoked and ls.settings.enable and (gave_up := await ls.until_backend_ready()) is not None:
        ls.gave_up_waiting("completion", gave_up)
        return types.CompletionList(is_incomplete=True, items=[])
    found = await ls.completer.complete(ls.settings, params.text_document.uri, params.position, automatic=not invoked)
    snippets = _snippet_support(ls)
    items = [completion_item(context, text, snippets, invoked) for context, text in found]  # one canvas: at most one
    return types.CompletionList(is_incomplete=True, items=items)


@server.feature(types.TEXT_DOCUMENT_INLINE_COMPLETION, types.InlineCompletionOptions())
async def inline_completion(
    ls: DiffgemmaServer, params: types.InlineCompletionParams
) -> types.InlineCompletionList | None:
    """Ghost text at the cursor; when invoked explicitly, up to ``candidates`` of them to cycle through."""
    automatic = params.context.trigger_kind == types.InlineCompletionTriggerKind.Automatic
    candidates = 1 if automatic else ls.settings.candidates
    if not automatic and ls.settings.enable and (gave_up := await ls.until_backend_ready()) is not None:
        ls.gave_up_waiting("completion", gave_up)
        return types.InlineCompletionList(items=[])
    found = await ls.completer.complete(ls.settings, params.text_document.uri, params.position, automatic, candidates)
    return types.InlineCompletionList(items=[inline_item(context, text) for context, text in found])


@server.feature(types.TEXT_DOCUMENT_DID_OPEN)
def did_open(ls: DiffgemmaServer, params: types.DidOpenTextDocumentParams) -> None:
    """An opened file becomes extra context for the others; its edits from now on go into the edit history."""
    uri = params.text_document.uri
    _forget_text(ls, uri, REOPENED)  # an opening starts afresh (a second didOpen of the same uri included)
    ls.completer.extra.add(uri, params.text_document.text)
    if ls.settings.repo_context_tokens:
        ls.completer.repo.document_opened(uri, params.text_document.text, params.text_document.language_id)
    document = ls.open_document(uri)
    if isinstance(document, LineDocument):
        document.on_replace = functools.partial(ls.completer.history.replaced, uri)


@server.feature(types.TEXT_DOCUMENT_DID_CHANGE)
def did_change(ls: DiffgemmaServer, params: types.DidChangeTextDocumentParams) -> None:
    """Note where the file was edited; its chunk is refreshed when the user works in another file."""
    change = params.content_changes[-1] if params.content_changes else None
    line = change.range.start.line if isinstance(change, types.TextDocumentContentChangePartial) else 0
    uri = params.text_document.uri
    ls.completer.extra.note_edit(uri, line)
    ls.completer.reindex(ls.settings, uri)
    ls.next_edits.changed(ls.settings, uri, line)


@server.feature(types.TEXT_DOCUMENT_DID_SAVE)
def did_save(ls: DiffgemmaServer, params: types.DidSaveTextDocumentParams) -> None:
    """A saved file is refreshed in the extra context once the user works elsewhere, and in the workspace index
    at once."""
    uri = params.text_document.uri
    ls.completer.extra.note_edit(uri, 0)
    ls.completer.reindex(ls.settings, uri, at_once=True)


@server.feature(types.TEXT_DOCUMENT_DID_CLOSE)
def did_close(ls: DiffgemmaServer, params: types.DidCloseTextDocumentParams) -> None:
    """Forget the document's shown completion and its chunk of extra context, and stop its work."""
    _forget_text(ls, params.text_document.uri, CLOSED)
    ls.completer.forget(params.text_document.uri)


def _forget_text(ls: DiffgemmaServer, uri: str, reason: str) -> None:
    """A document closed or opened anew: nothing computed for its text before outlives it (a rewrite, a completion
    shown, a next edit ready or computed ahead), and its work in the engine stops (the rewrite's says ``reason``)."""
    ls.rewriter.stop(uri, reason)
    ls.next_edits.forget(uri)
    ls.completer.forget_text(uri)


@server.feature(
    types.TEXT_DOCUMENT_CODE_ACTION,
    types.CodeActionOptions(code_action_kinds=[KIND, APPLY_KIND], resolve_provider=False),
)
def code_actions(ls: DiffgemmaServer, params: types.CodeActionParams) -> list[types.CodeAction] | None:
    """ "Rewrite selection" on a non-empty selection (its command does the work); "Apply suggested edit" on the
    cursor when a next edit is ready for the document as it is."""
    document = ls.open_document(params.text_document.uri)
    actions = [
        code_action(ls.settings, document, params),
        ls.next_edits.code_action(document, params, versioned=ls.edit_support()[1]),
    ]
    found = [action for action in actions if action is not None]
    return found or None


@server.feature(NEXT_EDIT_METHOD)
async def next_edit(ls: DiffgemmaServer, params: object) -> dict[str, object] | None:
    """``diffgemma/nextEdit``: the edit that follows the recent ones, in a window around the position, for the
    version asked (``{"uri", "version", "edits"}``), or null when there is none; waits for an engine that is still
    loading, as an explicit request does."""
    arguments = parse_next_edit(params)
    if ls.settings.next_edit_enabled and ls.open_document(arguments.uri) is not None:
        if (gave_up := await ls.until_backend_ready()) is not None:
            ls.gave_up_waiting("next edit", gave_up)
            return None
    suggestion = await ls.next_edits.suggest(ls.settings, arguments)
    return suggestion.answer() if suggestion is not None else None


@server.command(REWRITE_COMMAND)
async def rewrite_selection(ls: DiffgemmaServer, *args: object) -> dict[str, object]:
    """Rewrite the selection the argument names and apply the result as one edit: ``{"applied", "reason"}``.

    The progress it shows can be cancelled; a newer rewrite of the document supersedes it; an edit computed for a
    version the document has left is never applied. Bad arguments are an InvalidParams error.
    """
    arguments = parse_arguments(args)
    can_apply, versioned = ls.edit_support()
    if not can_apply:
        reason = "the editor takes no edits from the server (workspace/applyEdit)"
        return await ls.apply_rewrite(None, Outcome(reason=reason, show=types.MessageType.Warning))
    if ls.settings.rewrite_enabled and ls.open_document(arguments.uri) is not None:
        if (gave_up := await ls.until_backend_ready()) is not None:  # starting or loading: wait for it
            show = None if gave_up.reason == WAIT_CANCELLED else types.MessageType.Warning
            return await ls.apply_rewrite(None, Outcome(reason=f"no rewrite: {gave_up.reason}", show=show))
    started = ls.rewriter.start(ls.settings, arguments, versioned)
    if isinstance(started, Outcome):
        return await ls.apply_rewrite(None, started)
    try:
        async with ls.cancellable_progress("Rewriting the selection", lambda: started.stop(CANCELLED)):
            outcome = await started.outcome()
    finally:
        started.stop(CANCELLED)  # no-op once answered; stops the work if this request was cancelled
    return await ls.apply_rewrite(started, outcome)


STATUS_COMMAND = "diffgemma.status"


@server.command(STATUS_COMMAND)
def status(ls: DiffgemmaServer, *args: object) -> dict[str, object]:
    """The backend's state and this server's in-flight work (for status bars and tests)."""
    backend, completer = ls.backend, ls.completer
    return {
        "backend": ls.settings.backend,
        "engine": backend.state.value if backend else "not started",
        "model": backend.model_id if backend else "",
        "layout": backend.layout.value if backend else "",
        "pending": backend.pending_count() if backend else 0,
        "inflight": len(completer.owners),
        "tasks": len(asyncio.all_tasks()),
        "reuseHits": completer.shown.hits,
        "reuseLookups": completer.shown.lookups,
        "lastLatencyMs": round(completer.last_latency_ms, 1) if completer.last_latency_ms is not None else None,
        "lastTimings": attrs.asdict(completer.last_timings) if completer.last_timings is not None else None,
        "workspaceIndex": completer.repo.status(),
    }


@server.feature(types.SHUTDOWN)
async def shutdown(ls: DiffgemmaServer, params: None) -> None:
    """Disconnect from the backend; a local engine keeps serving other windows and exits when idle."""
    ls.completer.repo.stop()
    if ls.backend is not None:
        await ls.backend.close()
