"""Rewrite selection end to end: the real language server on the real engine (one for the module) on the memorized
checkpoint, the editor (pytest-lsp's client, applying ``workspace/applyEdit`` as a real one does) selects a wrong
middle, picks the code action, and the document ends up holding exactly the middle the checkpoint was trained on."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from lsprotocol import types
from pytest_lsp import LanguageClient

from diffgemma_lsp.features.rewrite import REFILLED
from tests.e2e.test_lsp_engine import _kill_engine
from tests.e2e.test_remote_backend import KEY_ENV, endpoint, remote_settings
from tests.support.engine import EngineProcess
from tests.support.lsp import (
    Editor,
    attached_client,
    rewrite,
    server_command,
    span,
    start_client,
    status,
    until_ready,
)
from tests.support.models import MEMORIZED_MIDDLE, MEMORIZED_PREFIX, MEMORIZED_SUFFIX
from tests.support.openai_endpoint import API_KEY, Endpoint

pytestmark = pytest.mark.e2e
URI = "file:///work/add.py"
WRONG_MIDDLE = MEMORIZED_MIDDLE.replace("a + b", "a - b")
"""The memorized middle with one token changed."""
SELECTED = span(1, 0, 2, len(WRONG_MIDDLE.split("\n")[1]))
"""The wrong middle: its two lines, without the line break after them."""
RIGHT = MEMORIZED_PREFIX + MEMORIZED_MIDDLE + MEMORIZED_SUFFIX
__all__ = ["endpoint"]  # the remote backend's server, a fixture shared with test_remote_backend.py


@pytest.fixture
async def lsp(
    isolated_env: Path, memorized_engine: EngineProcess
) -> AsyncIterator[tuple[LanguageClient, Editor, Path]]:
    """A language server of its own on the module's engine (it neither stops nor restarts it)."""
    socket_path = memorized_engine.socket_path
    async with attached_client(socket_path) as client:
        editor = Editor(client)
        assert WRONG_MIDDLE != MEMORIZED_MIDDLE
        editor.open(URI, MEMORIZED_PREFIX + WRONG_MIDDLE + MEMORIZED_SUFFIX)
        await until_ready(client)
        yield client, editor, socket_path


async def rewrite_action(client: LanguageClient) -> types.CodeAction:
    """The one code action offered on the wrong middle."""
    result = await client.text_document_code_action_async(
        types.CodeActionParams(
            text_document=types.TextDocumentIdentifier(uri=URI),
            range=SELECTED,
            context=types.CodeActionContext(diagnostics=[], trigger_kind=types.CodeActionTriggerKind.Invoked),
        )
    )
    [action] = list(result or [])
    assert isinstance(action, types.CodeAction) and action.title == "Rewrite selection"
    return action


@pytest.mark.parametrize("strength", [None, 1.0], ids=["default strength", "from noise"])
async def test_the_code_action_rewrites_a_wrong_middle_into_the_memorized_one(
    lsp: tuple[LanguageClient, Editor, Path], strength: float | None
) -> None:
    client, editor, _ = lsp
    if strength is not None:
        client.workspace_did_change_configuration(
            types.DidChangeConfigurationParams(
                settings={"diffgemma": {"debounceMs": 0, "extraContextTokens": 0, "rewriteStrength": strength}}
            )
        )
    action = await rewrite_action(client)
    assert action.command is not None
    result = await client.workspace_execute_command_async(
        types.ExecuteCommandParams(command=action.command.command, arguments=action.command.arguments)
    )
    assert result == {"applied": True, "reason": ""}, (result, client.messages)
    assert editor.text(URI) == RIGHT
    [edit] = editor.edits  # one edit: one undo step in the editor
    [change] = edit.edit.document_changes or []
    assert isinstance(change, types.TextDocumentEdit) and change.text_document.version == 1
    assert [text_edit.range for text_edit in change.edits] == [SELECTED]


async def test_an_edit_while_the_engine_works_on_the_rewrite_is_never_overwritten(
    lsp: tuple[LanguageClient, Editor, Path],
) -> None:
    """The engine is held (SIGSTOP) once the rewrite is sent, so that the user's edit surely lands first."""
    client, editor, socket_path = lsp
    pid = _kill_engine(socket_path, signal.SIGSTOP)
    assert pid is not None
    try:
        pending = asyncio.ensure_future(rewrite(client, URI, SELECTED, 1))
        deadline = asyncio.get_running_loop().time() + 30
        while (await status(client))["pending"] != 1:  # sent, and not answered
            assert asyncio.get_running_loop().time() < deadline, "the rewrite never reached the engine"
            await asyncio.sleep(0.05)
        editor.change(URI, types.TextDocumentContentChangePartial(range=span(0, 0, 0, 0), text="# typed meanwhile\n"))
        await status(client)  # the server has taken the edit
    finally:
        os.kill(pid, signal.SIGCONT)
    result = await pending
    assert result["applied"] is False and "changed" in str(result["reason"]), result
    assert editor.edits == []
    assert editor.text(URI) == "# typed meanwhile\n" + MEMORIZED_PREFIX + WRONG_MIDDLE + MEMORIZED_SUFFIX


def answer_progress_late(client: LanguageClient) -> tuple[asyncio.Event, asyncio.Event]:
    """Make the client slow to accept a progress token: (set when the server asked for one, set to answer it)."""
    asked, answer = asyncio.Event(), asyncio.Event()

    async def create(params: types.WorkDoneProgressCreateParams) -> None:
        client.progress_reports.setdefault(params.token, [])  # what pytest-lsp's own handler does
        asked.set()
        await answer.wait()

    del client.protocol.fm.features[types.WINDOW_WORK_DONE_PROGRESS_CREATE]  # pytest-lsp's, which answers at once
    client.feature(types.WINDOW_WORK_DONE_PROGRESS_CREATE)(create)
    return asked, answer


@pytest.mark.parametrize("how", ["closed and opened again", "opened a second time"])
async def test_an_edit_never_lands_on_a_document_opened_again_at_the_same_version(
    lsp: tuple[LanguageClient, Editor, Path], how: str
) -> None:
    """The client is slow to accept the rewrite's progress token; meanwhile the engine answers and the document is
    opened again with other text, at version 1 as before (versions restart per opening): no edit is sent, for the
    editor would take an edit for "version 1" computed on the old text."""
    client, editor, _ = lsp
    asked, answer = answer_progress_late(client)
    pending = asyncio.ensure_future(rewrite(client, URI, SELECTED, 1))
    await asyncio.wait_for(asked.wait(), 60)
    deadline = asyncio.get_running_loop().time() + 120
    while (await status(client))["pending"] != 0:  # the rewrite was sent before the token was asked for
        assert asyncio.get_running_loop().time() < deadline, "the engine never answered the rewrite"
        await asyncio.sleep(0.05)
    other = "# another text\n" + MEMORIZED_PREFIX + WRONG_MIDDLE + MEMORIZED_SUFFIX
    if how == "closed and opened again":
        editor.close(URI)
    editor.open(URI, other)  # version 1 again
    assert editor.version(URI) == 1
    await status(client)  # the server has taken the notifications
    answer.set()
    result = await pending
    assert result["applied"] is False and "changed" in str(result["reason"]), result
    assert editor.edits == []
    assert editor.text(URI) == other


def apply_as_utf16(text: str, edit: types.TextEdit) -> str:
    """``text`` (LF line breaks) after ``edit``, applied the way an editor that keeps UTF-16 does (VS Code): strict
    decoding fails on a lone surrogate left by a range edge inside a character."""
    lines = text.split("\n")

    def offset(position: types.Position) -> int:
        before = sum(len(line.encode("utf-16-le")) // 2 + 1 for line in lines[: position.line])
        return 2 * (before + position.character)

    units = text.encode("utf-16-le")
    new = edit.new_text.encode("utf-16-le")
    return (units[: offset(edit.range.start)] + new + units[offset(edit.range.end) :]).decode("utf-16-le")


async def test_a_selection_ending_inside_an_emoji_is_replaced_whole(lsp: tuple[LanguageClient, Editor, Path]) -> None:
    """The selection's end falls between the two UTF-16 units of an emoji: the server reads through the emoji, and
    the edit's range is that of the text read, so the document keeps no half of it."""
    client, editor, _ = lsp
    client.workspace_did_change_configuration(
        types.DidChangeConfigurationParams(
            settings={"diffgemma": {"debounceMs": 0, "extraContextTokens": 0, "rewriteStrength": 1.0}}
        )
    )  # from noise: the memorized middle whatever the selection holds
    line = "    return total  # 😀"
    original = MEMORIZED_PREFIX + WRONG_MIDDLE.replace("    return total", line) + MEMORIZED_SUFFIX
    uri = "file:///work/emoji.py"
    editor.open(uri, original)
    inside = span(1, 0, 2, len(line.encode("utf-16-le")) // 2 - 1)  # between the emoji's two units
    result: dict[str, Any] = await rewrite(client, uri, inside, 1)
    assert result == {"applied": True, "reason": ""}, (result, client.messages)
    [edit] = editor.edits
    [change] = edit.edit.document_changes or []
    assert isinstance(change, types.TextDocumentEdit)
    [text_edit] = change.edits
    assert isinstance(text_edit, types.TextEdit)
    assert text_edit.range == span(1, 0, 2, len(line.encode("utf-16-le")) // 2)  # after the emoji: the text read
    assert apply_as_utf16(original, text_edit) == RIGHT == editor.text(uri)


async def test_the_remote_backend_rewrites_by_filling_the_span_anew(
    isolated_env: Path, endpoint: Endpoint, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An OpenAI-compatible server cannot start from the selection: the span is filled anew between the same prefix
    and suffix, which the memorized checkpoint answers with its middle; the command says it re-filled."""
    monkeypatch.setenv(KEY_ENV, API_KEY)
    socket_path = isolated_env / "run" / "lsp-engine.sock"  # stays unused: the backend is remote
    client = await start_client(server_command(socket_path, None), init_options=remote_settings(endpoint.url))
    try:
        editor = Editor(client)
        editor.open(URI, MEMORIZED_PREFIX + WRONG_MIDDLE + MEMORIZED_SUFFIX)
        assert await rewrite(client, URI, SELECTED, 1) == {"applied": True, "reason": REFILLED}
        assert editor.text(URI) == RIGHT
    finally:
        await client.shutdown_session()
