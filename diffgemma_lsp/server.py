"""The language server: document sync, completion, inline completion, settings. Never imports torch."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import attrs
from lsprotocol import types
from pygls.exceptions import JsonRpcException, JsonRpcInvalidParams
from pygls.lsp.server import LanguageServer
from pygls.protocol import LanguageServerProtocol
from pygls.workspace import TextDocument

from diffgemma_lsp import __version__
from diffgemma_lsp.context import (
    CHARS_PER_TOKEN,
    InfillContext,
    PositionError,
    build_context,
    cursor_scope,
    end_of_line,
)
from diffgemma_lsp.document import LineWorkspace
from diffgemma_lsp.engine_client import (
    EngineClient,
    EngineRequestError,
    EngineState,
    EngineTimeout,
    EngineUnavailable,
    ExitCheck,
)
from diffgemma_lsp.extra_context import ExtraContext
from diffgemma_lsp.launcher import spawn_engine
from diffgemma_lsp.openai_client import OpenAIBackend
from diffgemma_lsp.postprocess import postprocess
from diffgemma_lsp.results import completion_item, inline_item
from diffgemma_lsp.reuse import ShownCompletions
from diffgemma_lsp.settings import Settings, parse_settings, plain_http_elsewhere
from engine import protocol

logger = logging.getLogger(__name__)


class DiffgemmaProtocol(LanguageServerProtocol):
    """pygls' protocol, except that a request whose params cannot be read still gets an error reply, and that
    documents are kept as lists of lines (``LineWorkspace``)."""

    @property
    def workspace(self) -> LineWorkspace:
        """pygls' workspace, made a ``LineWorkspace`` the first time it is used.

        pygls builds a plain ``Workspace`` inside ``lsp_initialize`` and has no option to build another kind. Its
        first use comes after that, from pygls' own handlers (``didOpen`` puts the first document in it) or ours:
        swapping it here, for one in the same state, happens before any document exists and needs neither a copy
        of pygls' ``lsp_initialize`` nor a patch of its module's ``Workspace`` (global, and blind to a renamed
        import). It relies on pygls keeping the workspace in ``_workspace``; the protocol tests fail if not.
        """
        workspace = super().workspace
        if not isinstance(workspace, LineWorkspace):
            workspace = self._workspace = LineWorkspace.like(workspace)
        return workspace

    def structure_message(self, data: dict[str, Any]) -> Any:
        """Deserialize; on failure, answer the request (pygls would drop it and the client would wait forever)."""
        try:
            return super().structure_message(data)
        except JsonRpcException as exc:
            if isinstance(data, dict) and "method" in data and isinstance(data.get("id"), int | str):
                detail = f": {exc.__cause__}" if exc.__cause__ is not None else ""
                error = JsonRpcInvalidParams(f"invalid params for {data['method']}{detail}")
                self._send_response(data["id"], None, error.to_response_error())
            raise


class DiffgemmaServer(LanguageServer):
    """Holds the settings, the engine connection and the latest request per document."""

    def __init__(self, engine_socket: Path | None = None, model: str | None = None) -> None:
        super().__init__("diffgemma-lsp", __version__, protocol_cls=DiffgemmaProtocol)
        self.engine_socket = engine_socket
        """The engine to use (``--engine-socket``); None: the one for the model and device settings."""
        self.settings = Settings(model=model)
        self.cli_model = model
        self.engine: EngineClient | OpenAIBackend | None = None
        """The local engine, or the remote OpenAI-compatible server (settings ``backend``)."""
        self.latest: dict[str, asyncio.Future[protocol.Result]] = {}
        """Per document uri, the engine call in flight; a newer request cancels it."""
        self.last_latency_ms: float | None = None
        self.last_timings: protocol.Timings | None = None
        """The engine's own timings of the last completion."""
        self.extra = ExtraContext()
        """Chunks of other files, sent as extra context."""
        self.shown = ShownCompletions()
        """The last completion per document, reused while the user types what it suggested."""
        self._progress_token: str | None = None
        self._outage_reported = False

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
        if self.engine is not None and previous.backend_key() != settings.backend_key():
            old, self.engine = self.engine, None  # the next completion connects to the new backend
            old.on_state = None  # its requests failing as it closes are not an outage to report
            asyncio.ensure_future(old.close())
        if problems:
            message = "diffgemma: " + "; ".join(problems)
            logger.warning("%s", message)
            self.window_show_message(types.ShowMessageParams(type=types.MessageType.Warning, message=message))

    # -- engine ------------------------------------------------------------------------------------------

    def start_engine_client(self) -> None:
        """Connect to the engine (starting one when none runs), or set up the remote backend."""
        if self.engine is not None:
            return
        settings = self.settings
        if settings.backend == "openai":
            if not settings.openai_url:
                self.on_engine_state(EngineState.FAILED, "the openai backend needs the openaiUrl setting")
                return
            if plain_http_elsewhere(settings.openai_url):
                message = (
                    f"diffgemma: completions send your code unencrypted to {settings.openai_url}; "
                    "use https:// (a TLS proxy in front of the server) unless this network is trusted"
                )
                logger.warning("%s", message)
                self.window_show_message(types.ShowMessageParams(type=types.MessageType.Warning, message=message))
            self.engine = OpenAIBackend(
                settings.openai_url,
                model=settings.openai_model,
                api_key_env=settings.openai_api_key_env,
                prompt_format=settings.openai_prompt_format,
                on_state=self.on_engine_state,
            )
            self.engine.start()
            return

        socket_path = self.engine_socket or protocol.socket_path_for(
            settings.model, settings.device, settings.quantization
        )

        async def start_engine() -> ExitCheck:
            return spawn_engine(socket_path, settings.model, settings.device, settings.quantization).exit_reason

        self.engine = EngineClient(socket_path, start_engine, self.on_engine_state)
        self.engine.start()

    def on_engine_state(self, state: EngineState, detail: str) -> None:
        """Show loading progress; report an outage once, and its end."""
        logger.info("engine %s%s", state.value, f": {detail}" if detail else "")
        if state in (EngineState.CONNECTING, EngineState.LOADING):
            self._begin_progress(
                "Loading the completion model"
                if state is EngineState.LOADING
                else "Connecting to the completion engine"
            )
        elif state is EngineState.READY:
            self._end_progress("Completion model ready")  # the outage ends with the first answer (engine_answered)
        elif state in (EngineState.FAILED, EngineState.DISCONNECTED) and detail and not self._outage_reported:
            self._outage_reported = True  # one message per outage, not one per keystroke
            self._end_progress(detail)
            self.window_show_message(
                types.ShowMessageParams(
                    type=types.MessageType.Warning,
                    message=f"diffgemma: {detail}. Completions are off until it is back.",
                )
            )

    def engine_answered(self) -> None:
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
            except Exception:  # noqa: BLE001 - a client may refuse progress; completions go on
                logger.debug("client refused work done progress", exc_info=True)
                return
            self.work_done_progress.begin(token, types.WorkDoneProgressBegin(title=title, cancellable=False))

        asyncio.ensure_future(begin())

    def _end_progress(self, message: str) -> None:
        token, self._progress_token = self._progress_token, None
        if token is not None:
            self.work_done_progress.end(token, types.WorkDoneProgressEnd(message=message))

    def _text_of(self, uri: str) -> str | None:
        document = self.open_document(uri)
        return document.source if document is not None else None

    def open_document(self, uri: str) -> TextDocument | None:
        """The open document ``uri`` names, or None. pygls keeps documents under their unquoted URIs (it looks
        them up so too): ``file:///my%20project/a.py`` is the document opened under that URI."""
        return self.workspace.text_documents.get(unquote(uri))

    # -- completion core ---------------------------------------------------------------------------------

    def context_at(self, uri: str, position: types.Position) -> InfillContext:
        """The infill context, or an InvalidParams error that says what is wrong with the request."""
        document = self.open_document(uri)
        if document is None:
            raise JsonRpcInvalidParams(f"{uri} is not open: send textDocument/didOpen first")
        try:
            return build_context(document, position, self.settings.context_tokens)
        except PositionError as exc:
            raise JsonRpcInvalidParams(str(exc)) from None

    async def complete(
        self, uri: str, position: types.Position, automatic: bool, candidates: int = 1
    ) -> list[tuple[InfillContext, str]]:
        """The distinct completions at ``position`` from ``candidates`` canvases, best first; empty when there is
        none (engine down, superseded, stale or nothing left after post-processing)."""
        settings = self.settings
        if not settings.enable:
            return []
        context = self.context_at(uri, position)
        document = self.workspace.get_text_document(uri)
        source = document.source
        previous = self.latest.pop(uri, None)
        if previous is not None:
            previous.cancel()
        if candidates == 1 and (rest := self.shown.lookup(uri, source, context.offset)) is not None:
            return [(context, rest)]  # the user is typing what we suggested: no model call
        if automatic and settings.debounce_ms and not await self._debounce(uri, settings.debounce_ms):
            return []  # a newer request for this document came in while we waited
        self.extra.take_edits(uri, self._text_of)
        extra = self.extra.for_request(uri, settings.extra_context_tokens * CHARS_PER_TOKEN)
        result = await self._ask_engine(
            uri,
            prefix=context.prefix,
            suffix=context.suffix,
            extra=[protocol.Chunk(filename=chunk.name, text=chunk.text) for chunk in extra],
            language_id=document.language_id or "",
            doc_version=context.version or 0,
            canvas_length=settings.canvas_length,
            max_steps=settings.steps,
            scope=cursor_scope(context.prefix),
            candidates=candidates,
        )
        if result is None or self.workspace.get_text_document(uri).version != context.version:
            return []  # no answer, or the document changed while the model worked: the result is stale
        found: list[tuple[InfillContext, str]] = []
        instruct = self.engine is not None and self.engine.hello is not None and self.engine.hello.instruct
        for raw in (result.text, *result.alternatives):
            edit = postprocess(context.prefix, context.suffix, raw, document.language_id or "", instruct=instruct)
            if edit is None or any(edit.text == text for _, text in found):
                continue
            end = end_of_line(context) if edit.replace_to_eol else None
            found.append((attrs.evolve(context, replace_end=end), edit.text))
        if found:
            self.shown.remember(uri, source, context.offset, found[0][1])
        return found

    async def _debounce(self, uri: str, debounce_ms: int) -> bool:
        """Wait ``debounce_ms``; False if a newer request for ``uri`` arrived meanwhile."""
        marker: asyncio.Future[protocol.Result] = asyncio.get_running_loop().create_future()
        self.latest[uri] = marker
        await asyncio.sleep(debounce_ms / 1000)
        return self.latest.get(uri) is marker

    async def _ask_engine(self, uri: str, **fields: Any) -> protocol.Result | None:
        """One infill for ``uri``, latest-wins: a newer request for ``uri`` cancels this one in the engine too."""
        if self.engine is None:
            self.start_engine_client()
            if self.engine is None:
                return None
        request = protocol.Infill(id=self.engine.new_id(), uri=uri, **fields)
        started = time.perf_counter()
        call = asyncio.ensure_future(self.engine.infill(request))
        self.latest[uri] = call
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
            self.engine_answered()
            return None
        finally:
            if self.latest.get(uri) is call:
                del self.latest[uri]
        self.engine_answered()
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
        return result


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
    """Connect to the engine, starting it when none runs (not while completions are disabled)."""
    if ls.settings.enable:
        ls.start_engine_client()


@server.feature(types.WORKSPACE_DID_CHANGE_CONFIGURATION)
def did_change_configuration(ls: DiffgemmaServer, params: types.DidChangeConfigurationParams) -> None:
    """Take the new settings."""
    ls.apply_settings(params.settings)


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
    found = await ls.complete(params.text_document.uri, params.position, automatic=not invoked)
    snippets = _snippet_support(ls)
    items = [completion_item(context, text, snippets) for context, text in found]  # one canvas: at most one
    return types.CompletionList(is_incomplete=True, items=items)


@server.feature(types.TEXT_DOCUMENT_INLINE_COMPLETION, types.InlineCompletionOptions())
async def inline_completion(
    ls: DiffgemmaServer, params: types.InlineCompletionParams
) -> types.InlineCompletionList | None:
    """Ghost text at the cursor; when invoked explicitly, up to ``candidates`` of them to cycle through."""
    automatic = params.context.trigger_kind == types.InlineCompletionTriggerKind.Automatic
    candidates = 1 if automatic else ls.settings.candidates
    found = await ls.complete(params.text_document.uri, params.position, automatic, candidates)
    return types.InlineCompletionList(items=[inline_item(context, text) for context, text in found])


@server.feature(types.TEXT_DOCUMENT_DID_OPEN)
def did_open(ls: DiffgemmaServer, params: types.DidOpenTextDocumentParams) -> None:
    """An opened file becomes extra context for the others."""
    ls.extra.add(params.text_document.uri, params.text_document.text)


@server.feature(types.TEXT_DOCUMENT_DID_CHANGE)
def did_change(ls: DiffgemmaServer, params: types.DidChangeTextDocumentParams) -> None:
    """Note where the file was edited; its chunk is refreshed when the user works in another file."""
    change = params.content_changes[-1] if params.content_changes else None
    line = change.range.start.line if isinstance(change, types.TextDocumentContentChangePartial) else 0
    ls.extra.note_edit(params.text_document.uri, line)


@server.feature(types.TEXT_DOCUMENT_DID_SAVE)
def did_save(ls: DiffgemmaServer, params: types.DidSaveTextDocumentParams) -> None:
    """A saved file is refreshed in the extra context once the user works elsewhere."""
    ls.extra.note_edit(params.text_document.uri, 0)


@server.feature(types.TEXT_DOCUMENT_DID_CLOSE)
def did_close(ls: DiffgemmaServer, params: types.DidCloseTextDocumentParams) -> None:
    """Forget the document's shown completion and its chunk of extra context, and stop its work."""
    uri = params.text_document.uri
    ls.shown.forget(uri)
    ls.extra.remove(uri)
    if (call := ls.latest.pop(uri, None)) is not None:
        call.cancel()


STATUS_COMMAND = "diffgemma.status"


@server.command(STATUS_COMMAND)
def status(ls: DiffgemmaServer, *args: object) -> dict[str, object]:
    """The engine's state and this server's in-flight work (for status bars and tests)."""
    engine = ls.engine
    return {
        "backend": ls.settings.backend,
        "engine": engine.state.value if engine else "not started",
        "model": engine.hello.model_id if engine and engine.hello else "",
        "layout": engine.hello.layout if engine and engine.hello else "",
        "pending": engine.pending_count() if engine else 0,
        "inflight": len(ls.latest),
        "tasks": len(asyncio.all_tasks()),
        "reuseHits": ls.shown.hits,
        "reuseLookups": ls.shown.lookups,
        "lastLatencyMs": round(ls.last_latency_ms, 1) if ls.last_latency_ms is not None else None,
        "lastTimings": attrs.asdict(ls.last_timings) if ls.last_timings is not None else None,
    }


@server.feature(types.SHUTDOWN)
async def shutdown(ls: DiffgemmaServer, params: None) -> None:
    """Disconnect from the engine; it keeps serving other windows and exits when idle."""
    if ls.engine is not None:
        await ls.engine.close()
