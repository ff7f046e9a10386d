"""Drive the real ``diffgemma-lsp`` over stdio with pytest-lsp's client."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

from lsprotocol import types
from pytest_lsp import ClientServerConfig, LanguageClient, client_capabilities

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
        caps.text_document.inline_completion = types.InlineCompletionClientCapabilities(
            dynamic_registration=False
        )
    return caps


async def start_client(
    command: list[str],
    init_options: object = None,
    preset: str = "visual-studio-code",
    root: Path | None = None,
) -> LanguageClient:
    """Start the server and finish the initialize handshake."""
    client = await ClientServerConfig(server_command=command, server_env=dict(os.environ)).start()
    assert isinstance(client, LanguageClient)
    await client.initialize_session(
        types.InitializeParams(
            capabilities=capabilities(preset),
            root_uri=root.as_uri() if root else None,
            initialization_options=init_options,
        )
    )
    return client


def open_document(client: LanguageClient, uri: str, text: str, version: int = 1) -> None:
    """``textDocument/didOpen`` for a Python file."""
    client.text_document_did_open(
        types.DidOpenTextDocumentParams(
            text_document=types.TextDocumentItem(uri=uri, language_id="python", version=version, text=text)
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


async def complete_when_ready(
    client: LanguageClient, uri: str, line: int, character: int, timeout: float = READY_TIMEOUT_S
) -> types.CompletionList:
    """Ask until the engine (started by the server) has loaded and answers with an item."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        result = await complete(client, uri, line, character)
        if result.items or asyncio.get_running_loop().time() > deadline:
            return result
        await asyncio.sleep(0.25)
