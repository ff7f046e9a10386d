"""The language server's LSP edge: the protocol override, the settings, the workspace folders, and thin
``@feature`` handlers, each handing its request to the session (``session.py``) or to one feature
(``features/``: completion, rewrite, next edit). The only module that imports ``features/``. Never imports torch."""

from __future__ import annotations

import asyncio
import functools
import logging
import sys
import uuid
from pathlib import Path
from typing import Any, BinaryIO

import attrs
from lsprotocol import types
from pygls.lsp.server import LanguageServer

from diffgemma_lsp import __version__, stdio
from diffgemma_lsp.backend_link import BackendLink
from diffgemma_lsp.document import LineDocument
from diffgemma_lsp.features import rewrite
from diffgemma_lsp.features.completion import Completions
from diffgemma_lsp.features.next_edit import APPLY_KIND, NextEdits
from diffgemma_lsp.features.rewrite import REWRITE_COMMAND, Rewrites
from diffgemma_lsp.grammars import LANGUAGE_OF_EXTENSION
from diffgemma_lsp.index_progress import IndexProgress
from diffgemma_lsp.jsonrpc import DiffgemmaProtocol
from diffgemma_lsp.params import NEXT_EDIT_METHOD
from diffgemma_lsp.repo.live import path_of
from diffgemma_lsp.results import converter
from diffgemma_lsp.session import Session
from diffgemma_lsp.settings import Settings, parse_settings

logger = logging.getLogger(__name__)

CLOSED = "the document was closed"
REOPENED = "the document was opened anew"


class DiffgemmaServer(LanguageServer):
    """Holds the settings, the session and the features over it."""

    def __init__(self, engine_socket: Path | None = None, model: str | None = None) -> None:
        super().__init__("diffgemma-lsp", __version__, protocol_cls=DiffgemmaProtocol, converter_factory=converter)
        self.settings = Settings(model=model)
        self.cli_model = model
        self.link = BackendLink(self, lambda: self.settings, engine_socket)
        """The backend and what the user is told of it."""
        self.session = Session(lambda uri: self.workspace.text_documents.get(uri), self.link, self)
        """What every feature shares: documents, backend, the request in flight per document, prompt context."""
        self.completions = Completions(self.session)
        self.rewrites = Rewrites(self.session)
        self.next_edits = NextEdits(self.session)
        """Next-edit suggestions: computed after a burst of edits or an accepted suggestion, one per document."""
        self.session.repo.on_progress = IndexProgress(self, self.link.supports_progress)
        self.initialized = False
        self._watching = False

    def start_io(self, stdin: BinaryIO | None = None, stdout: BinaryIO | None = None) -> None:
        """Serve on stdin and stdout, stdin read by the event loop (``diffgemma_lsp.stdio``), not a thread."""
        stdio.serve(self, stdin or sys.stdin.buffer, stdout or sys.stdout.buffer)

    def report_server_error(self, error: Exception, source: Any) -> None:
        """Log server errors; never a popup for one bad message (pygls shows one by default)."""
        logger.error("server error (%s): %s", getattr(source, "__name__", source), error)

    def apply_settings(self, raw: object) -> None:
        """Take new settings; report bad keys once and use their defaults."""
        settings, problems = parse_settings(raw)
        if settings.model is None and self.cli_model is not None:
            settings = attrs.evolve(settings, model=self.cli_model)
        previous, self.settings = self.settings, settings
        self.link.settings_changed(previous, settings)  # the next completion connects to a new backend
        self.session.repo.index.set_private_patterns(settings.private_files)  # what it names leaves the index
        if problems:
            message = "diffgemma: " + "; ".join(problems)
            logger.warning("%s", message)
            self.window_show_message(types.ShowMessageParams(type=types.MessageType.Warning, message=message))

    def start_index(self) -> None:
        """Index the workspace folders in the background (once each) while the workspace context is on, and ask
        the client, where it can, to report its source files' changes on disk."""
        folders = [folder.uri for folder in self.workspace.folders.values()]
        if not folders and self.workspace.root_uri:
            folders = [self.workspace.root_uri]
        roots = [Path(path) for uri in folders if (path := path_of(uri))]
        self.session.privacy.add_roots(roots)  # a file outside them never goes into a prompt
        if not self.settings.repo_context_tokens:
            return
        self.session.repo.start(roots)
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

    def forget_text(self, uri: str, reason: str) -> None:
        """A document closed or opened anew: nothing computed for its text before outlives it (a rewrite, a
        completion shown, a next edit ready or computed ahead), and its work in the engine stops (saying
        ``reason``)."""
        self.next_edits.forget(uri)
        self.session.forget_text(uri, reason)


server = DiffgemmaServer()


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
        ls.link.start()
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
    privacy = ls.session.privacy
    privacy.set_roots([root for root in privacy.roots if root not in {path.resolve() for path in removed}] + added)
    if ls.settings.repo_context_tokens:
        ls.session.repo.folders_changed(added, removed)


@server.feature(types.WORKSPACE_DID_CHANGE_WATCHED_FILES)
def did_change_watched_files(ls: DiffgemmaServer, params: types.DidChangeWatchedFilesParams) -> None:
    """Files created, changed or deleted on disk (by the editor's file watching): the index reads them again,
    except open documents (their text is what counts)."""
    if not ls.settings.repo_context_tokens:
        return
    for change in params.changes:
        if ls.session.open_document(change.uri) is None:
            ls.session.repo.file_changed(change.uri, deleted=change.type == types.FileChangeType.Deleted)


@server.feature(
    types.TEXT_DOCUMENT_COMPLETION,
    types.CompletionOptions(resolve_provider=False, trigger_characters=[".", "(", " ", "\n"]),
)
async def completion(ls: DiffgemmaServer, params: types.CompletionParams) -> types.CompletionList | None:
    """One item carrying the whole multi-line completion as a text edit (``Completions.menu``)."""
    return await ls.completions.menu(ls.settings, params)


@server.feature(types.TEXT_DOCUMENT_INLINE_COMPLETION, types.InlineCompletionOptions())
async def inline_completion(
    ls: DiffgemmaServer, params: types.InlineCompletionParams
) -> types.InlineCompletionList | None:
    """Ghost text at the cursor; when invoked explicitly, up to ``candidates`` of them to cycle through."""
    return await ls.completions.inline(ls.settings, params)


@server.feature(types.TEXT_DOCUMENT_DID_OPEN)
def did_open(ls: DiffgemmaServer, params: types.DidOpenTextDocumentParams) -> None:
    """An opened file becomes extra context for the others; its edits from now on go into the edit history."""
    uri, session = params.text_document.uri, ls.session
    ls.forget_text(uri, REOPENED)  # an opening starts afresh (a second didOpen of the same uri included)
    session.extra.add(uri, params.text_document.text)
    if ls.settings.repo_context_tokens:
        session.repo.document_opened(uri, params.text_document.text, params.text_document.language_id)
    document = ls.session.open_document(uri)
    if isinstance(document, LineDocument):
        document.on_replace = functools.partial(session.history.replaced, uri)


@server.feature(types.TEXT_DOCUMENT_DID_CHANGE)
def did_change(ls: DiffgemmaServer, params: types.DidChangeTextDocumentParams) -> None:
    """Note where the file was edited; its chunk is refreshed when the user works in another file."""
    change = params.content_changes[-1] if params.content_changes else None
    line = change.range.start.line if isinstance(change, types.TextDocumentContentChangePartial) else 0
    uri = params.text_document.uri
    ls.session.extra.note_edit(uri, line)
    ls.session.reindex(ls.settings, uri)
    ls.next_edits.changed(ls.settings, uri, line)


@server.feature(types.TEXT_DOCUMENT_DID_SAVE)
def did_save(ls: DiffgemmaServer, params: types.DidSaveTextDocumentParams) -> None:
    """A saved file is refreshed in the extra context once the user works elsewhere, and in the workspace index
    at once."""
    uri = params.text_document.uri
    ls.session.extra.note_edit(uri, 0)
    ls.session.reindex(ls.settings, uri, at_once=True)


@server.feature(types.TEXT_DOCUMENT_DID_CLOSE)
def did_close(ls: DiffgemmaServer, params: types.DidCloseTextDocumentParams) -> None:
    """Forget the document's shown completion and its chunk of extra context, and stop its work."""
    ls.next_edits.forget(params.text_document.uri)
    ls.session.forget(params.text_document.uri, CLOSED)


@server.feature(
    types.TEXT_DOCUMENT_CODE_ACTION,
    types.CodeActionOptions(code_action_kinds=[rewrite.KIND, APPLY_KIND], resolve_provider=False),
)
def code_actions(ls: DiffgemmaServer, params: types.CodeActionParams) -> list[types.CodeAction] | None:
    """ "Rewrite selection" on a non-empty selection (its command does the work); "Apply suggested edit" on the
    cursor when a next edit is ready for the document as it is."""
    document = ls.session.open_document(params.text_document.uri)
    actions = [
        rewrite.code_action(ls.settings, document, params),
        ls.next_edits.code_action(document, params, versioned=ls.session.edit_support()[1]),
    ]
    found = [action for action in actions if action is not None]
    return found or None


@server.feature(NEXT_EDIT_METHOD)
async def next_edit(ls: DiffgemmaServer, params: object) -> dict[str, object] | None:
    """``diffgemma/nextEdit``: the edit that follows the recent ones, or null (``NextEdits.request``)."""
    return await ls.next_edits.request(ls.settings, params)


@server.command(REWRITE_COMMAND)
async def rewrite_selection(ls: DiffgemmaServer, *args: object) -> dict[str, object]:
    """Rewrite the selection the argument names and apply the result as one edit: ``{"applied", "reason"}``.

    The progress it shows can be cancelled; a newer rewrite of the document supersedes it; an edit computed for a
    version the document has left is never applied. Bad arguments are an InvalidParams error.
    """
    return await ls.rewrites.run(ls.settings, rewrite.parse_arguments(args))


STATUS_COMMAND = "diffgemma.status"


@server.command(STATUS_COMMAND)
def status(ls: DiffgemmaServer, *args: object) -> dict[str, object]:
    """The backend's state and this server's in-flight work (for status bars and tests)."""
    backend, session, completions = ls.link.backend, ls.session, ls.completions
    latency_ms, timings = completions.last_latency_ms, completions.last_timings
    return {
        "backend": ls.settings.backend,
        "engine": backend.state.value if backend else "not started",
        "model": backend.model_id if backend else "",
        "layout": backend.layout.value if backend else "",
        "pending": backend.pending_count() if backend else 0,
        "inflight": len(session.inflight),
        "tasks": len(asyncio.all_tasks()),
        "reuseHits": session.shown.hits,
        "reuseLookups": session.shown.lookups,
        "lastLatencyMs": round(latency_ms, 1) if latency_ms is not None else None,
        "lastTimings": attrs.asdict(timings) if timings is not None else None,
        "workspaceIndex": session.repo.status(),
    }


@server.feature(types.SHUTDOWN)
async def shutdown(ls: DiffgemmaServer, params: None) -> None:
    """Disconnect from the backend; a local engine keeps serving other windows and exits when idle."""
    ls.session.repo.stop()
    await ls.link.close()
