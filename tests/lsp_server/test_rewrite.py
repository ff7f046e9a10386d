"""Rewrite selection over real LSP: the real language server (a subprocess, driven by pytest-lsp's client), the code
action and its command, the progress, the versioned edit, and what never gets applied.

A fake engine on the server's socket (tests/support/fake_engine.py ``Rewrites``) speaks the real wire: it answers
each rewrite with a fixed text once the test releases it, so that a test can edit the document, cancel or send a
second rewrite while the first is surely in flight. The editor side (``Editor``) applies ``workspace/applyEdit`` as
a real client does and refuses an edit made for another version.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import attrs
import pytest
import pytest_asyncio
from lsprotocol import types
from pygls.exceptions import JsonRpcException
from pytest_lsp import LanguageClient

from diffgemma_engine.shared import protocol
from diffgemma_lsp.backends.base import OLD_ENGINE
from diffgemma_lsp.features.completion import REWRITE_IN_FLIGHT
from tests.support.fake_engine import Rewrites
from tests.support.lsp import Editor, RewritesServer, complete, on_rewrites, rewrite, span, status, until_ready

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="module")]
URI = "file:///work/add.py"
PREFIX = "def add(a, b):\n"
WRONG = "    total = a - b\n    return total"
FIXED = "    total = a + b\n    return total"
SUFFIX = "\n\nprint(add(1, 2))\n"
SELECTED = span(1, 0, 2, 16)
"""``WRONG``: the two lines of the function's body, without the line break after them."""


@attrs.frozen
class Session:
    client: LanguageClient
    editor: Editor
    engine: Rewrites
    initialized: types.InitializeResult


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def shared(module_tmp: Path) -> AsyncIterator[RewritesServer]:
    """One server for the module's tests."""
    async with on_rewrites(module_tmp, Rewrites(FIXED)) as server:
        yield server


@contextlib.asynccontextmanager
async def session(
    shared: RewritesServer, engine: Rewrites, options: dict[str, object] | None = None
) -> AsyncIterator[Session]:
    """The shared server with ``options`` on ``engine``, ``SOURCE`` open, the engine connected; what the test before
    left open closed (``reconfigured``)."""
    editor = shared.turn(engine, **(options or {}))
    editor.open(URI, PREFIX + WRONG + SUFFIX)
    await until_ready(editor.client)
    yield Session(editor.client, editor, engine, shared.initialized)


@contextlib.asynccontextmanager
async def own_session(isolated_env: Path, engine: Rewrites) -> AsyncIterator[Session]:
    """``session`` on a server of its own, for a test that stops it or whose engine shakes hands otherwise."""
    async with on_rewrites(isolated_env, engine) as own, session(own, engine) as s:
        yield s


async def code_actions(client: LanguageClient, selected: types.Range) -> list[types.CodeAction]:
    result = await client.text_document_code_action_async(
        types.CodeActionParams(
            text_document=types.TextDocumentIdentifier(uri=URI),
            range=selected,
            context=types.CodeActionContext(diagnostics=[], trigger_kind=types.CodeActionTriggerKind.Invoked),
        )
    )
    assert all(isinstance(action, types.CodeAction) for action in result or []), result
    return list(result or [])  # type: ignore[arg-type]


async def run_action(client: LanguageClient, action: types.CodeAction) -> dict[str, object]:
    """Run the action's command, as an editor does when the user picks it."""
    assert action.command is not None
    result = await client.workspace_execute_command_async(
        types.ExecuteCommandParams(command=action.command.command, arguments=action.command.arguments)
    )
    assert isinstance(result, dict)
    return result


async def in_flight(engine: Rewrites, count: int = 1) -> None:
    """Until the engine holds ``count`` rewrites."""
    deadline = asyncio.get_running_loop().time() + 30
    while len(engine.rewrites()) < count:
        assert asyncio.get_running_loop().time() < deadline, "the rewrite never reached the engine"
        await asyncio.sleep(0.02)


def rewrite_progress(client: LanguageClient) -> list[tuple[types.ProgressToken, list[object]]]:
    """The progress the server showed for rewrites: (token, reports), in order."""
    return [
        (token, reports)
        for token, reports in client.progress_reports.items()
        if reports and getattr(reports[0], "title", "") == "Rewriting the selection"
    ]


@pytest.fixture
def engine() -> Rewrites:
    return Rewrites(FIXED)


async def test_the_action_is_offered_on_a_selection_only(shared: RewritesServer, engine: Rewrites) -> None:
    async with session(shared, engine) as s:
        commands = s.initialized.capabilities.execute_command_provider
        assert commands is not None and "diffgemma.rewriteSelection" in commands.commands
        provider = s.initialized.capabilities.code_action_provider
        assert isinstance(provider, types.CodeActionOptions) and list(provider.code_action_kinds or []) == [
            "refactor.rewrite",
            "refactor.rewrite.nextEdit",  # "Apply suggested edit" (tests/lsp_server/test_next_edit.py)
        ]
        [action] = await code_actions(s.client, SELECTED)
        assert (action.title, action.kind) == ("Rewrite selection", types.CodeActionKind.RefactorRewrite)
        assert action.command is not None and action.command.command == "diffgemma.rewriteSelection"
        assert list(action.command.arguments or []) == [
            {"uri": URI, "range": s.client.protocol._converter.unstructure(SELECTED), "version": 1}
        ]
        assert await code_actions(s.client, span(1, 4, 1, 4)) == []  # a cursor, no selection
        s.client.workspace_did_change_configuration(
            types.DidChangeConfigurationParams(settings={"diffgemma": {"rewriteEnabled": False}})
        )
        assert await code_actions(s.client, SELECTED) == []
        assert engine.received == []  # offering the action costs no model call


async def test_the_actions_command_applies_one_versioned_edit_with_progress(
    shared: RewritesServer, engine: Rewrites
) -> None:
    engine.release.set()
    async with session(shared, engine, {"rewriteStrength": 0.4, "rewriteSteps": 6}) as s:
        [action] = await code_actions(s.client, SELECTED)
        assert await run_action(s.client, action) == {"applied": True, "reason": ""}
        assert s.editor.text(URI) == PREFIX + FIXED + SUFFIX
        [edit] = s.editor.edits
        assert edit.label == "Rewrite selection"
        [change] = edit.edit.document_changes or []
        assert isinstance(change, types.TextDocumentEdit) and change.text_document.version == 1
        assert list(change.edits) == [types.TextEdit(range=SELECTED, new_text=FIXED)]
        [request] = engine.rewrites()
        assert request.start == [protocol.StartSegment(text=WRONG)]
        assert (request.prefix, request.suffix, request.strength, request.max_steps) == (PREFIX, SUFFIX, 0.4, 6)
        [(_, reports)] = rewrite_progress(s.client)
        assert [report.kind for report in reports] == ["begin", "end"]  # type: ignore[attr-defined]
        assert reports[0].cancellable is True  # type: ignore[attr-defined]
        assert s.client.messages == []


async def test_an_edit_while_the_rewrite_is_in_flight_is_never_overwritten(
    shared: RewritesServer, engine: Rewrites
) -> None:
    async with session(shared, engine) as s:
        pending = asyncio.ensure_future(rewrite(s.client, URI, SELECTED, 1))
        await in_flight(engine)
        typed = types.TextDocumentContentChangePartial(range=span(4, 0, 4, 0), text="# typed meanwhile\n")
        s.editor.change(URI, typed)
        await status(s.client)  # the server has taken the edit (version 2) before the engine answers
        engine.release.set()
        result = await pending
        assert result["applied"] is False and "changed" in str(result["reason"]), result
        assert s.editor.edits == []  # nothing was even sent
        assert s.editor.text(URI) == PREFIX + WRONG + "\n\n# typed meanwhile\nprint(add(1, 2))\n"
        assert any("changed" in message.message for message in s.client.messages), s.client.messages


async def test_a_rewrite_of_an_old_version_is_not_started(shared: RewritesServer, engine: Rewrites) -> None:
    engine.release.set()
    async with session(shared, engine) as s:
        [action] = await code_actions(s.client, SELECTED)  # offered for version 1
        s.editor.change(URI, types.TextDocumentContentChangePartial(range=span(0, 0, 0, 0), text="# new\n"))
        result = await run_action(s.client, action)
        assert result["applied"] is False and "changed" in str(result["reason"])
        assert engine.rewrites() == [] and s.editor.edits == []


async def test_the_editor_refusing_the_edit_is_told(shared: RewritesServer, engine: Rewrites) -> None:
    engine.release.set()
    async with session(shared, engine) as s:
        s.editor.refuse = True
        result = await rewrite(s.client, URI, SELECTED, 1)
        assert result == {"applied": False, "reason": "the editor did not apply the edit: refused by the test"}
        assert len(s.editor.edits) == 1 and s.editor.text(URI) == PREFIX + WRONG + SUFFIX


async def test_cancelling_the_progress_cancels_the_engines_work(shared: RewritesServer, engine: Rewrites) -> None:
    async with session(shared, engine) as s:
        pending = asyncio.ensure_future(rewrite(s.client, URI, SELECTED, 1))
        await in_flight(engine)
        deadline = asyncio.get_running_loop().time() + 10
        while not rewrite_progress(s.client):
            assert asyncio.get_running_loop().time() < deadline, "no progress shown"
            await asyncio.sleep(0.02)
        [(token, _)] = rewrite_progress(s.client)
        s.client.window_work_done_progress_cancel(types.WorkDoneProgressCancelParams(token=token))
        assert await pending == {"applied": False, "reason": "cancelled"}
        assert engine.cancelled == [engine.rewrites()[0].id]  # the engine was told to stop
        assert s.editor.edits == [] and s.client.messages == []
        [(_, reports)] = rewrite_progress(s.client)
        assert reports[-1].kind == "end"  # type: ignore[attr-defined]


async def test_a_second_rewrite_of_the_document_supersedes_the_first(shared: RewritesServer, engine: Rewrites) -> None:
    async with session(shared, engine) as s:
        first = asyncio.ensure_future(rewrite(s.client, URI, SELECTED, 1))
        await in_flight(engine)
        second = asyncio.ensure_future(rewrite(s.client, URI, SELECTED, 1, instruction="use a plus"))
        assert await first == {"applied": False, "reason": "superseded by a newer rewrite of this document"}
        await in_flight(engine, 2)
        old, new = engine.rewrites()
        assert engine.cancelled == [old.id] and new.instruction == "use a plus"
        engine.release.set()
        assert await second == {"applied": True, "reason": ""}
        assert s.editor.text(URI) == PREFIX + FIXED + SUFFIX and len(s.editor.edits) == 1


async def test_completions_of_the_document_wait_for_its_rewrite(shared: RewritesServer, engine: Rewrites) -> None:
    """The engine keeps one request per document and connection: a completion would supersede the rewrite."""
    async with session(shared, engine) as s:
        pending = asyncio.ensure_future(rewrite(s.client, URI, SELECTED, 1))
        await in_flight(engine)
        assert list((await complete(s.client, URI, 1, 4)).items) == []
        assert len(engine.received) == 1  # the completion was not sent
        told = [message.message for message in s.client.messages]
        assert told == [f"diffgemma: no completion: {REWRITE_IN_FLIGHT}"]  # the user invoked it: told why
        engine.release.set()
        assert (await pending)["applied"] is True
        await complete(s.client, URI, 1, 4)
        assert len(engine.received) == 2  # and afterwards it is


async def test_shutdown_while_a_rewrite_is_in_flight_is_answered(isolated_env: Path, engine: Rewrites) -> None:
    """pygls cancelled the in-flight command while iterating the dict it took it out of: the shutdown request got
    "dictionary changed size during iteration" (the session's exit raised it)."""
    async with own_session(isolated_env, engine) as s:  # a server of its own: it stops it
        pending = asyncio.ensure_future(rewrite(s.client, URI, SELECTED, 1))
        await in_flight(engine)
    with contextlib.suppress(JsonRpcException, asyncio.CancelledError):
        await pending  # cancelled by the shutdown: whatever it answered, nothing was applied
    assert s.editor.edits == []


@pytest.mark.parametrize(
    ("argument", "says"),
    [
        (None, "one argument object"),
        ({"range": {"start": {"line": 1, "character": 0}, "end": {"line": 2, "character": 16}}, "version": 1}, "uri"),
        ({"uri": "file:///work/never-opened.py", "range": None, "version": 1}, "range"),
        (
            {
                "uri": "file:///work/never-opened.py",
                "range": {"start": {"line": 0, "character": 0}, "end": {"line": 0, "character": 1}},
                "version": 1,
            },
            "not open",
        ),
        (
            {
                "uri": URI,
                "range": {"start": {"line": 1, "character": 4}, "end": {"line": 1, "character": 4}},
                "version": 1,
            },
            "empty",
        ),
        (
            {
                "uri": URI,
                "range": {"start": {"line": 1, "character": 0}, "end": {"line": 40, "character": 0}},
                "version": 1,
            },
            "not in the document",
        ),
        ({"uri": URI, "range": {"start": {"line": 1, "character": 0}, "end": {"line": 2, "character": 0}}}, "version"),
    ],
    ids=["no argument", "no uri", "no range", "not open", "empty", "past the end", "no version"],
)
async def test_bad_arguments_are_invalid_params_and_the_server_keeps_serving(
    shared: RewritesServer, engine: Rewrites, argument: object, says: str
) -> None:
    engine.release.set()
    async with session(shared, engine) as s:
        arguments = [] if argument is None else [argument]
        with pytest.raises(JsonRpcException, match=says) as caught:
            await s.client.workspace_execute_command_async(
                types.ExecuteCommandParams(command="diffgemma.rewriteSelection", arguments=arguments)
            )
        assert caught.value.code == -32602
        assert engine.rewrites() == []
        assert await rewrite(s.client, URI, SELECTED, 1) == {"applied": True, "reason": ""}


async def test_an_engine_that_predates_rewrites_is_not_asked(isolated_env: Path) -> None:
    engine = Rewrites(FIXED, features=())
    engine.release.set()
    async with own_session(isolated_env, engine) as s:  # its engine's handshake lists no rewrites
        assert await rewrite(s.client, URI, SELECTED, 1) == {"applied": False, "reason": OLD_ENGINE}
        assert engine.received == [] and s.editor.edits == []
        assert [message.message for message in s.client.messages] == [f"diffgemma: {OLD_ENGINE}"]
