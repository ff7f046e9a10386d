"""The real language server, which starts the real engine, on a small real DiffusionGemma checkpoint."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from lsprotocol import types
from pygls.exceptions import JsonRpcException
from pytest_lsp import LanguageClient

from diffgemma_engine.shared import socket_paths
from tests.support.engine import EngineProcess
from tests.support.lsp import (
    attached_client,
    complete,
    complete_when_ready,
    inline_complete,
    open_document,
    server_command,
    start_client,
)
from tests.support.lsp import status as status_of
from tests.support.models import MEMORIZED_MIDDLE, MEMORIZED_PREFIX, MEMORIZED_SUFFIX

pytestmark = pytest.mark.e2e
URI = "file:///work/example.py"
SOURCE = MEMORIZED_PREFIX + MEMORIZED_SUFFIX
CURSOR = (1, 0)  # the start of the line after "def add(a, b):"


@contextlib.asynccontextmanager
async def lsp_session(
    isolated_env: Path, model_dir: Path, **settings: object
) -> AsyncIterator[tuple[LanguageClient, Path]]:
    """The real language server on ``model_dir`` (it starts its engine), no debounce and no other files; other
    ``settings`` as the client sends them."""
    socket_path = isolated_env / "run" / "engine.sock"
    client = await start_client(
        server_command(socket_path, model_dir),
        init_options={"diffgemma": {"debounceMs": 0, "extraContextTokens": 0, **settings}},
    )
    try:
        yield client, socket_path
    finally:
        await client.shutdown_session()
        _kill_engine(socket_path, signal.SIGTERM)


@pytest.fixture
async def own_lsp(isolated_env: Path, memorized_model_dir: Path) -> AsyncIterator[tuple[LanguageClient, Path]]:
    """A language server that starts its own engine (the first completion waits for its model to load)."""
    async with lsp_session(isolated_env, memorized_model_dir) as session:
        yield session


@pytest.fixture
async def lsp(isolated_env: Path, memorized_engine: EngineProcess) -> AsyncIterator[tuple[LanguageClient, Path]]:
    """A language server of its own on the module's engine (``--engine-socket``: it finds it serving)."""
    async with attached_client(memorized_engine.socket_path) as client:
        yield client, memorized_engine.socket_path


def _engine_pid(socket_path: Path) -> int | None:
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"serve" in cmdline and str(socket_path).encode() in cmdline:
            return int(pid)
    return None


def _kill_engine(socket_path: Path, signum: int) -> int | None:
    pid = _engine_pid(socket_path)
    if pid is not None:
        os.kill(pid, signum)
    return pid


async def test_completion_is_the_engines_multi_line_middle(own_lsp: tuple[LanguageClient, Path]) -> None:
    client, socket_path = own_lsp
    open_document(client, URI, SOURCE)
    result = await complete_when_ready(client, URI, *CURSOR)
    assert len(result.items) == 1
    item = result.items[0]
    assert isinstance(item.text_edit, types.TextEdit)
    assert item.text_edit.new_text == MEMORIZED_MIDDLE  # VS Code's capabilities: no snippet escaping needed here
    assert "\n" in item.text_edit.new_text
    assert item.text_edit.range.start == types.Position(line=1, character=0)
    assert _engine_pid(socket_path) is not None  # the server started the engine itself
    # While it connected and the model loaded, the editor showed progress, ended once the engine was ready.
    kinds = [getattr(report, "kind", None) for reports in client.progress_reports.values() for report in reports]
    assert kinds[0] == "begin" and "end" in kinds, client.progress_reports


async def test_typing_the_suggestion_reuses_it_without_the_model(lsp: tuple[LanguageClient, Path]) -> None:
    client, _ = lsp
    open_document(client, URI, SOURCE)
    await complete_when_ready(client, URI, *CURSOR)
    typed = MEMORIZED_MIDDLE[:6]  # "    to"
    client.text_document_did_change(
        types.DidChangeTextDocumentParams(
            text_document=types.VersionedTextDocumentIdentifier(uri=URI, version=2),
            content_changes=[
                types.TextDocumentContentChangePartial(
                    range=types.Range(
                        start=types.Position(line=1, character=0), end=types.Position(line=1, character=0)
                    ),
                    text=typed,
                )
            ],
        )
    )
    result = await complete(client, URI, 1, len(typed))
    assert result.items[0].text_edit.new_text == "to" + MEMORIZED_MIDDLE[6:]  # the word "to" is replaced too
    status = await status_of(client)
    assert status["reuseHits"] == 1


async def test_other_files_go_into_the_prompt_as_extra_context(lsp: tuple[LanguageClient, Path]) -> None:
    client, _ = lsp
    open_document(client, URI, SOURCE)
    await complete_when_ready(client, URI, *CURSOR)

    async def prompt_tokens() -> int:
        await complete(client, URI, *CURSOR)
        status = await status_of(client)
        return status["lastTimings"]["prompt_tokens"]

    alone = await prompt_tokens()
    open_document(client, "file:///work/helpers.py", "def helper(value):\n    return value * 2\n")
    client.workspace_did_change_configuration(
        types.DidChangeConfigurationParams(settings={"debounceMs": 0, "extraContextTokens": 256})
    )
    with_extra = await prompt_tokens()
    assert with_extra > alone + 10  # the other file's chunk and its name


async def test_inline_completion_gives_ghost_text(lsp: tuple[LanguageClient, Path]) -> None:
    client, _ = lsp
    open_document(client, URI, SOURCE)
    await complete_when_ready(client, URI, *CURSOR)
    result = await inline_complete(client, URI, *CURSOR)
    assert [item.insert_text for item in result.items] == [MEMORIZED_MIDDLE]
    assert result.items[0].range.start == result.items[0].range.end == types.Position(line=1, character=0)


async def test_position_past_the_end_is_a_clear_error_and_the_server_keeps_serving(
    lsp: tuple[LanguageClient, Path],
) -> None:
    client, _ = lsp
    open_document(client, URI, SOURCE)
    await complete_when_ready(client, URI, *CURSOR)
    with pytest.raises(JsonRpcException, match="past the end"):
        await complete(client, URI, 40, 0)
    assert (await complete(client, URI, *CURSOR)).items[0].text_edit.new_text == MEMORIZED_MIDDLE


async def test_huge_document_and_unknown_uri(lsp: tuple[LanguageClient, Path]) -> None:
    client, _ = lsp
    open_document(client, URI, SOURCE)
    await complete_when_ready(client, URI, *CURSOR)
    huge_uri = "file:///work/huge.py"
    huge = "x = 1\n" * 900_000  # about 5 MB
    open_document(client, huge_uri, huge + SOURCE)
    # The context is cut to the budget: the model answers for the window around the cursor.
    assert isinstance(await complete(client, huge_uri, huge.count("\n") + 1, 0), types.CompletionList)
    assert isinstance(await complete(client, huge_uri, 450_000, 3), types.CompletionList)
    with pytest.raises(JsonRpcException, match="not open"):
        await complete(client, "file:///nowhere/never-opened.py", 0, 0)
    assert (await complete(client, URI, *CURSOR)).items[0].text_edit.new_text == MEMORIZED_MIDDLE


async def test_stale_result_is_dropped(lsp: tuple[LanguageClient, Path]) -> None:
    """An edit that lands while the model works makes the result stale: nothing is shown. The engine is held
    (SIGSTOP) while the request waits on it, so that the edit surely lands first (the tiny model answers in
    milliseconds: without the hold, which came first was a race)."""
    client, socket_path = lsp
    open_document(client, URI, SOURCE)
    await complete_when_ready(client, URI, *CURSOR)
    client.text_document_did_change(  # not what was shown: the next request goes to the engine
        types.DidChangeTextDocumentParams(
            text_document=types.VersionedTextDocumentIdentifier(uri=URI, version=2),
            content_changes=[types.TextDocumentContentChangeWholeDocument(text="# one\n" + SOURCE)],
        )
    )
    pid = _kill_engine(socket_path, signal.SIGSTOP)
    assert pid is not None
    try:
        pending = asyncio.ensure_future(complete(client, URI, CURSOR[0] + 1, CURSOR[1]))
        await asyncio.sleep(0.5)  # the server has built the context (version 2) and waits on the engine
        client.text_document_did_change(
            types.DidChangeTextDocumentParams(
                text_document=types.VersionedTextDocumentIdentifier(uri=URI, version=3),
                content_changes=[types.TextDocumentContentChangeWholeDocument(text="# two\n# one\n" + SOURCE)],
            )
        )
        await asyncio.sleep(0.2)
    finally:
        os.kill(pid, signal.SIGCONT)
    assert len((await pending).items) == 0


async def test_engine_killed_then_the_next_completion_works(own_lsp: tuple[LanguageClient, Path]) -> None:
    client, socket_path = own_lsp
    open_document(client, URI, SOURCE)
    await complete_when_ready(client, URI, *CURSOR)
    old_pid = _kill_engine(socket_path, signal.SIGKILL)
    assert old_pid is not None
    # Meanwhile: empty answers, never an error.
    assert isinstance(await complete(client, URI, *CURSOR), types.CompletionList)
    result = await complete_when_ready(client, URI, *CURSOR)
    assert result.items[0].text_edit.new_text == MEMORIZED_MIDDLE
    assert _engine_pid(socket_path) not in (None, old_pid)


async def test_invalid_settings_are_reported_once_and_defaults_used(
    isolated_env: Path, memorized_engine: EngineProcess
) -> None:
    client = await start_client(
        server_command(memorized_engine.socket_path, None),
        init_options={"canvasLength": "long", "debounceMs": 0, "extraContextTokens": 0, "colour": "blue"},
    )
    try:
        open_document(client, URI, SOURCE)
        result = await complete_when_ready(client, URI, *CURSOR)
        assert result.items[0].text_edit.new_text == MEMORIZED_MIDDLE
        warnings = [m.message for m in client.messages if "canvasLength" in m.message]
        assert len(warnings) == 1 and "colour" in warnings[0]
    finally:
        await client.shutdown_session()


async def test_an_invoked_request_offers_several_candidates(isolated_env: Path, random_model_dir: Path) -> None:
    """An invoked inline completion denoises three canvases in one batch; the distinct ones come back."""
    socket_path = isolated_env / "run" / "engine.sock"
    client = await start_client(
        server_command(socket_path, random_model_dir),
        init_options={"diffgemma": {"debounceMs": 0, "extraContextTokens": 0, "candidates": 3}},
    )
    try:
        open_document(client, URI, "def f():\n    \n")
        await complete_when_ready(client, URI, 1, 4)

        async def inline(trigger: types.InlineCompletionTriggerKind) -> types.InlineCompletionList:
            return await client.text_document_inline_completion_async(
                types.InlineCompletionParams(
                    text_document=types.TextDocumentIdentifier(uri=URI),
                    position=types.Position(line=1, character=4),
                    context=types.InlineCompletionContext(trigger_kind=trigger),
                )
            )

        invoked = await inline(types.InlineCompletionTriggerKind.Invoked)
        texts = [item.insert_text for item in invoked.items]
        assert 2 <= len(texts) <= 3 and len(set(texts)) == len(texts), texts  # random weights: they differ
        assert len((await inline(types.InlineCompletionTriggerKind.Automatic)).items) == 1  # typing computes one
        assert len((await complete(client, URI, 1, 4)).items) == 1  # so does the menu
    finally:
        await client.shutdown_session()
        _kill_engine(socket_path, signal.SIGTERM)


async def test_changing_the_model_setting_switches_engines(
    isolated_env: Path, memorized_model_dir: Path, random_model_dir: Path
) -> None:
    """Each (model, device) has its own engine: the new setting takes effect without restarting the editor."""
    command = [arg for arg in server_command(isolated_env / "unused.sock", None) if "unused" not in arg]
    command.remove("--engine-socket")
    settings = {"debounceMs": 0, "extraContextTokens": 0, "model": str(memorized_model_dir)}
    client = await start_client(command, init_options={"diffgemma": settings})
    sockets = [
        socket_paths.socket_path_for(str(memorized_model_dir)),
        socket_paths.socket_path_for(str(random_model_dir)),
    ]
    try:
        open_document(client, URI, SOURCE)
        result = await complete_when_ready(client, URI, *CURSOR)
        assert [item.text_edit.new_text for item in result.items] == [MEMORIZED_MIDDLE]
        client.workspace_did_change_configuration(
            types.DidChangeConfigurationParams(settings={"diffgemma": dict(settings, model=str(random_model_dir))})
        )
        await complete_when_ready(client, URI, *CURSOR)
        status = await status_of(client)
        assert status["model"] == str(random_model_dir), status
        assert all(_engine_pid(path) is not None for path in sockets)  # the first still serves other windows
    finally:
        await client.shutdown_session()
        for path in sockets:
            _kill_engine(path, signal.SIGTERM)


async def test_a_model_that_cannot_load_is_reported_once_and_not_retried(isolated_env: Path) -> None:
    """A bad model folder: one message that says why, empty completions, and no engine restarted every few s."""
    not_a_model = isolated_env / "not-a-model"
    not_a_model.mkdir()
    (not_a_model / "config.json").write_text("{}")
    socket_path = isolated_env / "run" / "engine.sock"
    log_file = isolated_env / "lsp.log"
    command = [*server_command(socket_path, not_a_model), "--log-file", str(log_file)]
    client = await start_client(command, init_options={"diffgemma": {"debounceMs": 0}})
    try:
        open_document(client, URI, SOURCE)
        deadline = asyncio.get_running_loop().time() + 120
        while not client.messages:
            assert asyncio.get_running_loop().time() < deadline, log_file.read_text()
            assert len((await complete(client, URI, *CURSOR)).items) == 0
            await asyncio.sleep(0.2)
        await asyncio.sleep(8)  # long enough for several restarts, had there been any
        for _ in range(5):
            assert len((await complete(client, URI, *CURSOR)).items) == 0
        assert len(client.messages) == 1, client.messages
        message = client.messages[0].message
        assert "failed to load" in message and "check the model setting" in message, message
        assert log_file.read_text().count("starting engine") == 1
    finally:
        await client.shutdown_session()
        _kill_engine(socket_path, signal.SIGTERM)
