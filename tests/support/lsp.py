"""Drive the real ``diffgemma-lsp`` over stdio with pytest-lsp's client."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import IO, Any

import attrs
import pytest
from lsprotocol import types
from pygls.workspace import TextDocument
from pytest_lsp import ClientServerConfig, LanguageClient, client_capabilities

from diffgemma_lsp.context import clamp_position
from tests.support.fake_engine import Handler, Rewrites, serving
from tests.support.xdg import xdg_environment

READY_TIMEOUT_S = 120


def server_command(socket_path: Path, model_dir: Path | None) -> list[str]:
    """The language server's command line, as an editor would run it."""
    command = [sys.executable, "-m", "diffgemma_lsp", "--stdio", "--engine-socket", str(socket_path)]
    if model_dir is not None:
        command += ["--model", str(model_dir)]
    return command


def capabilities(preset: str = "visual-studio-code", inline: bool = True) -> types.ClientCapabilities:
    """A real client's recorded capabilities, with inline completion (LSP 3.18) switched on or off."""
    caps = client_capabilities(preset)
    caps.window = caps.window or types.WindowClientCapabilities()
    caps.window.work_done_progress = True
    if inline:
        caps.text_document.inline_completion = types.InlineCompletionClientCapabilities(dynamic_registration=False)
    return caps


async def start_session(
    command: list[str],
    init_options: object = None,
    preset: str = "visual-studio-code",
    root: Path | None = None,
) -> tuple[LanguageClient, types.InitializeResult]:
    """Start the server and finish the initialize handshake: the client and the server's answer to ``initialize``."""
    client = await ClientServerConfig(server_command=command, server_env=dict(os.environ)).start()
    assert isinstance(client, LanguageClient)
    initialized = await client.initialize_session(
        types.InitializeParams(
            capabilities=capabilities(preset),
            root_uri=root.as_uri() if root else None,
            initialization_options=init_options,
        )
    )
    return client, initialized


async def start_client(
    command: list[str],
    init_options: object = None,
    preset: str = "visual-studio-code",
    root: Path | None = None,
) -> LanguageClient:
    """Start the server and finish the initialize handshake (``start_session``'s client)."""
    client, _ = await start_session(command, init_options, preset, root)
    return client


def server_settings(**settings: object) -> dict[str, object]:
    """The settings a test's server is sent, as the client's payload: no debounce and no other files, then
    ``settings``."""
    return {"diffgemma": {"debounceMs": 0, "extraContextTokens": 0, **settings}}


@contextlib.asynccontextmanager
async def attached_session(
    socket_path: Path, **settings: object
) -> AsyncIterator[tuple[LanguageClient, types.InitializeResult]]:
    """A language server of its own on the engine that serves ``socket_path`` (``--engine-socket`` and no model: it
    finds the engine serving and starts none), no debounce and no other files; other ``settings`` as the client
    sends them; with the server's answer to ``initialize``. The engine is left serving (a module's shared engine:
    ``memorized_engine``)."""
    client, initialized = await start_session(
        server_command(socket_path, None), init_options=server_settings(**settings)
    )
    try:
        yield client, initialized
    finally:
        await client.shutdown_session()


@contextlib.asynccontextmanager
async def attached_client(socket_path: Path, **settings: object) -> AsyncIterator[LanguageClient]:
    """``attached_session``'s client."""
    async with attached_session(socket_path, **settings) as (client, _):
        yield client


@contextlib.asynccontextmanager
async def on_fake_engine(
    root: Path, handler: Handler, **settings: object
) -> AsyncIterator[tuple[LanguageClient, types.InitializeResult]]:
    """The real language server on a fake engine (tests/support/fake_engine.py) that runs ``handler`` on a socket
    in ``root``/run, for what a real engine cannot be made to do (hold an answer, rewrite with a fixed text): an
    ``attached_session`` with ``settings``."""
    socket_dir = root / "run"
    socket_dir.mkdir(mode=0o700, exist_ok=True)
    socket_path = socket_dir / "engine.sock"
    async with serving(socket_path, handler), attached_session(socket_path, **settings) as session:
        yield session


@attrs.define
class RewritesServer:
    """A real language server on a fake engine that rewrites (``on_rewrites``), the ``Editor`` on it and its answer to
    ``initialize``. Its connection answers with what ``engine`` says and records in it: the tests of a module that
    share one each set their own ``Rewrites`` there for their turn (with ``reconfigured``)."""

    engine: Rewrites
    editor: Editor = attrs.field(init=False)
    initialized: types.InitializeResult = attrs.field(init=False)

    def turn(self, engine: Rewrites, **settings: object) -> Editor:
        """The editor for a test's turn on this server, with ``engine`` answering and ``settings`` sent
        (``reconfigured``)."""
        self.engine = engine
        return reconfigured(self.editor, **settings)


@contextlib.asynccontextmanager
async def on_rewrites(root: Path, engine: Rewrites) -> AsyncIterator[RewritesServer]:
    """``on_fake_engine`` with ``engine`` (then whatever ``RewritesServer.engine`` is) in ``root``, the server's XDG
    folders there as ``isolated_env`` gives a test's (``root``: ``module_tmp`` for a server a module's tests share)."""
    server = RewritesServer(engine)
    with pytest.MonkeyPatch.context() as patch:
        for name, value in xdg_environment(root).items():
            patch.setenv(name, value)
        async with on_fake_engine(root, engine.handler(lambda: server.engine)) as (client, initialized):
            server.editor, server.initialized = Editor(client), initialized
            yield server


def reconfigured(editor: Editor, **settings: object) -> Editor:
    """``editor`` for one test's turn on a server that a module's tests share: every document it still holds from
    the test before is closed (the server forgets their text, edits, next edits and extra context), its record of
    edits emptied (and it applies them again), the client's record of messages and progress emptied, and
    ``settings`` sent with ``workspace/didChangeConfiguration`` as ``attached_session`` sends them at the start (a
    setting not named takes its default again). The server handles these notifications before any request sent
    after them."""
    for uri in list(editor.documents):
        editor.close(uri)
    editor.edits.clear()
    editor.refuse = False
    editor.client.messages.clear()
    editor.client.progress_reports.clear()
    editor.client.workspace_did_change_configuration(
        types.DidChangeConfigurationParams(settings=server_settings(**settings))
    )
    return editor


def open_document(client: LanguageClient, uri: str, text: str, version: int = 1) -> None:
    """``textDocument/didOpen`` for a Python file."""
    client.text_document_did_open(
        types.DidOpenTextDocumentParams(
            text_document=types.TextDocumentItem(uri=uri, language_id="python", version=version, text=text)
        )
    )


def replace_text(client: LanguageClient, uri: str, version: int, where: types.Range, text: str) -> None:
    """``textDocument/didChange``: ``text`` in place of ``where``, the document now at ``version``."""
    client.text_document_did_change(
        types.DidChangeTextDocumentParams(
            text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=version),
            content_changes=[types.TextDocumentContentChangePartial(range=where, text=text)],
        )
    )


async def complete(client: LanguageClient, uri: str, line: int, character: int) -> types.CompletionList:
    """An explicitly invoked ``textDocument/completion``."""
    result = await client.text_document_completion_async(
        types.CompletionParams(
            text_document=types.TextDocumentIdentifier(uri=uri),
            position=types.Position(line=line, character=character),
            context=types.CompletionContext(trigger_kind=types.CompletionTriggerKind.Invoked),
        )
    )
    assert isinstance(result, types.CompletionList)
    return result


async def inline_complete(
    client: LanguageClient,
    uri: str,
    line: int,
    character: int,
    trigger: types.InlineCompletionTriggerKind = types.InlineCompletionTriggerKind.Invoked,
) -> types.InlineCompletionList:
    """A ``textDocument/inlineCompletion`` (explicitly invoked unless ``trigger`` says otherwise)."""
    result = await client.text_document_inline_completion_async(
        types.InlineCompletionParams(
            text_document=types.TextDocumentIdentifier(uri=uri),
            position=types.Position(line=line, character=character),
            context=types.InlineCompletionContext(trigger_kind=trigger),
        )
    )
    assert isinstance(result, types.InlineCompletionList)
    return result


async def status(client: LanguageClient) -> dict[str, object]:
    """The server's ``diffgemma.status``; its answer also says every message sent before it was handled."""
    result = await client.workspace_execute_command_async(types.ExecuteCommandParams(command="diffgemma.status"))
    assert isinstance(result, dict)
    return result


async def until_ready(client: LanguageClient, timeout_s: float = READY_TIMEOUT_S) -> None:
    """Until the server's engine is ready (the engine it started has loaded its model; one that starts vLLM: once
    vLLM answers ``/health``)."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while (await status(client))["engine"] != "ready":
        assert asyncio.get_running_loop().time() < deadline, "the engine never became ready"
        await asyncio.sleep(0.05)


async def complete_when_ready(
    client: LanguageClient, uri: str, line: int, character: int, timeout: float = READY_TIMEOUT_S
) -> types.CompletionList:
    """Ask until the engine (started by the server) has loaded and answers with an item: for a document the model
    answers. Where the answer may be empty (a model that does not know the document), ``until_ready`` then
    ``complete``."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        result = await complete(client, uri, line, character)
        if result.items or asyncio.get_running_loop().time() > deadline:
            return result
        await asyncio.sleep(0.25)


class RawLsp:
    """A bare JSON-RPC client on the server's stdin and stdout; it records every message the server sends."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        assert process.stdin is not None and process.stdout is not None
        self.process = process
        self.stdin = process.stdin
        self.stdout = process.stdout
        self.responses: dict[object, list[dict[str, Any]]] = {}
        """Every response, by request id (a list, so duplicates would show)."""
        self.notifications: list[dict[str, Any]] = []
        self._arrived = asyncio.Event()
        self._reader = asyncio.ensure_future(self._read_all())

    @classmethod
    async def start(
        cls, command: list[str], stderr: int | IO[bytes] = asyncio.subprocess.DEVNULL, env: dict[str, str] | None = None
    ) -> RawLsp:
        """Start the server process (its error output to ``stderr``, in ``env`` when given)."""
        process = await asyncio.create_subprocess_exec(
            *command, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=stderr, env=env
        )
        return cls(process)

    async def _read_all(self) -> None:
        try:
            while True:
                header = await self.stdout.readuntil(b"\r\n\r\n")
                length = int(re.search(rb"Content-Length: (\d+)", header).group(1))  # type: ignore[union-attr]
                message = json.loads(await self.stdout.readexactly(length))
                if "method" in message:
                    if "id" in message:  # a request from the server: accept it
                        self.send_raw(json.dumps({"jsonrpc": "2.0", "id": message["id"], "result": None}).encode())
                    else:
                        self.notifications.append(message)
                else:
                    self.responses.setdefault(message.get("id"), []).append(message)
                self._arrived.set()
        except (asyncio.IncompleteReadError, ConnectionError):
            return

    def send_raw(self, payload: bytes) -> None:
        """One framed message, bytes as given."""
        self.stdin.write(b"Content-Length: %d\r\n\r\n" % len(payload) + payload)

    def request(self, request_id: int, method: str, params: object = None) -> None:
        """Send a request (the reply arrives in ``responses``)."""
        self.send_raw(json.dumps({"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}).encode())

    def notify(self, method: str, params: object = None) -> None:
        """Send a notification."""
        self.send_raw(json.dumps({"jsonrpc": "2.0", "method": method, "params": params}).encode())

    async def reply(self, want_id: int, timeout: float = 60) -> dict[str, Any]:
        """Wait for the response to ``want_id``."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while want_id not in self.responses:
            self._arrived.clear()
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise TimeoutError(f"no reply to request {want_id}")
            try:
                await asyncio.wait_for(self._arrived.wait(), remaining)
            except TimeoutError:
                continue
        return self.responses[want_id][0]

    async def initialize(self, options: object, capabilities: object = None, root_uri: str | None = None) -> None:
        """The initialize handshake (``root_uri``: the workspace folder)."""
        params = {"capabilities": capabilities or {}, "initializationOptions": options, "rootUri": root_uri}
        self.request(1, "initialize", params)
        assert "result" in await self.reply(1)
        self.notify("initialized", {})

    def open(self, uri: str, text: str, version: int = 1) -> None:
        """``textDocument/didOpen`` for a Python file."""
        self.notify(
            "textDocument/didOpen",
            {"textDocument": {"uri": uri, "languageId": "python", "version": version, "text": text}},
        )

    async def stop(self) -> None:
        """Kill the server."""
        self._reader.cancel()
        if self.process.returncode is None:
            self.process.kill()
            await self.process.wait()


class Editor:
    """What an editor does with the documents it opened: keeps their text and version, applies the server's
    ``workspace/applyEdit`` as a real client does (refusing an edit made for another version), and sends the result
    as ``didChange``. Records every edit the server sent."""

    def __init__(self, client: LanguageClient) -> None:
        self.client = client
        self.documents: dict[str, TextDocument] = {}
        self.edits: list[types.ApplyWorkspaceEditParams] = []
        """Every ``workspace/applyEdit`` received, applied or not."""
        self.refuse = False
        """Answer every edit with ``applied: false`` (an editor whose user closed the file, say)."""

        def apply_edit(params: types.ApplyWorkspaceEditParams) -> types.ApplyWorkspaceEditResult:
            return self._apply_edit(params)

        client.feature(types.WORKSPACE_APPLY_EDIT)(apply_edit)  # pygls marks the function: not a bound method
        converter = client.protocol._converter
        converter.register_structure_hook(
            types.Command | types.CodeAction,  # type: ignore[arg-type]
            lambda raw, _: converter.structure(
                raw, types.Command if isinstance(raw.get("command"), str) else types.CodeAction
            ),
        )  # as editors tell them apart (lsprotocol's own hook reads any CodeAction with a command as a Command)

    def open(self, uri: str, text: str, version: int = 1) -> None:
        """``didOpen`` for a Python file."""
        self.documents[uri] = TextDocument(uri, text, version=version, language_id="python")
        open_document(self.client, uri, text, version)

    def close(self, uri: str) -> None:
        """``didClose``: the editor forgets the document (opening it again starts its versions anew)."""
        del self.documents[uri]
        self.client.text_document_did_close(
            types.DidCloseTextDocumentParams(text_document=types.TextDocumentIdentifier(uri=uri))
        )

    def text(self, uri: str) -> str:
        """The document's text as the editor holds it."""
        return self.documents[uri].source

    def version(self, uri: str) -> int:
        """The document's version as the editor holds it."""
        version = self.documents[uri].version
        assert version is not None
        return version

    def change(self, uri: str, change: types.TextDocumentContentChangePartial) -> None:
        """The user edits the document: applied here, then sent as ``didChange`` with the next version."""
        document = self.documents[uri]
        document.apply_change(change)
        document.version = self.version(uri) + 1
        self.client.text_document_did_change(
            types.DidChangeTextDocumentParams(
                text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=document.version),
                content_changes=[change],
            )
        )

    def apply(self, edit: types.WorkspaceEdit) -> types.ApplyWorkspaceEditResult:
        """The user picks a code action that carries ``edit``: the editor applies it as it applies the server's
        ``workspace/applyEdit`` (refused for another version), then sends ``didChange``."""
        return self._apply_edit(types.ApplyWorkspaceEditParams(edit=edit))

    def _apply_edit(self, params: types.ApplyWorkspaceEditParams) -> types.ApplyWorkspaceEditResult:
        self.edits.append(params)
        if self.refuse:
            return types.ApplyWorkspaceEditResult(applied=False, failure_reason="refused by the test")
        changes = params.edit.document_changes or []
        for change in changes:
            assert isinstance(change, types.TextDocumentEdit), change
            uri, version = change.text_document.uri, change.text_document.version
            if uri not in self.documents or version != self.version(uri):
                return types.ApplyWorkspaceEditResult(
                    applied=False, failure_reason=f"{uri} is not at version {version}"
                )
        for change in changes:
            assert isinstance(change, types.TextDocumentEdit)
            edits = sorted(change.edits, key=lambda e: (e.range.start.line, e.range.start.character), reverse=True)
            for edit in edits:
                assert isinstance(edit, types.TextEdit)
                # as VS Code reads a range: a character past its line's end is the line's end (LSP), never past
                # its line break (pygls' own change would take that as the next line's start)
                document = self.documents[change.text_document.uri]
                start, end = (clamp_position(document, at) for at in (edit.range.start, edit.range.end))
                self.change(
                    change.text_document.uri,
                    types.TextDocumentContentChangePartial(range=types.Range(start=start, end=end), text=edit.new_text),
                )
        return types.ApplyWorkspaceEditResult(applied=bool(changes))


async def rewrite(
    client: LanguageClient, uri: str, selected: types.Range, version: int, instruction: str | None = None
) -> dict[str, Any]:
    """``workspace/executeCommand`` diffgemma.rewriteSelection, as the code action's command runs it."""
    argument: dict[str, Any] = {
        "uri": uri,
        "range": client.protocol._converter.unstructure(selected),
        "version": version,
    }
    if instruction is not None:
        argument["instruction"] = instruction
    result = await client.workspace_execute_command_async(
        types.ExecuteCommandParams(command="diffgemma.rewriteSelection", arguments=[argument])
    )
    assert isinstance(result, dict), result
    return result


def span(start_line: int, start_character: int, end_line: int, end_character: int) -> types.Range:
    """An LSP range."""
    return types.Range(
        start=types.Position(line=start_line, character=start_character),
        end=types.Position(line=end_line, character=end_character),
    )
