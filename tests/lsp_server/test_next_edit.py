"""Issue 29: ``diffgemma/nextEdit`` and "Apply suggested edit" in the real language server, with a fake engine that
rewrites (tests/support/fake_engine.py ``Rewrites``: every rewrite answered with a fixed text).

After the user renamed a parameter, the next edit is its use below: the server asks the engine to rewrite the
window of lines around the cursor from the code that is there (a small share renoised), diffs the answer into
whole-line edits for the version asked, and offers them as a code action while the text is the same."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio
from lsprotocol import types
from pygls.exceptions import JsonRpcInvalidParams
from pytest_lsp import LanguageClient

from diffgemma_lsp.edit_history import BURST_GAP_S
from diffgemma_lsp.features.next_edit import APPLY_KIND, APPLY_TITLE
from diffgemma_lsp.next_edit_notice import UNSURE_NOTICE_AFTER, unsure_notice
from tests.support.fake_engine import Rewrites
from tests.support.lsp import Editor, RewritesServer, complete, on_rewrites, rewrite, span
from tests.support.next_edits import AREA, FOLLOWED, RENAMED

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="module")]
URI = "file:///work/area.py"
RENAME = types.TextDocumentContentChangePartial(range=span(0, 9, 0, 14), text="size")
"""The user's edit: ``width`` renamed ``size`` in the signature."""


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def shared(module_tmp: Path) -> AsyncIterator[RewritesServer]:
    """One server for the module's tests."""
    async with on_rewrites(module_tmp, Rewrites(answer="")) as server:
        yield server


@contextlib.asynccontextmanager
async def session(
    shared: RewritesServer, engine: Rewrites, **settings: object
) -> AsyncIterator[tuple[LanguageClient, Editor]]:
    """The shared server with ``settings`` on ``engine``, ``AREA`` open and the rename typed (``RENAMED``, version
    2); what the test before left open closed (``reconfigured``)."""
    editor = shared.turn(engine, **settings)
    editor.open(URI, AREA)
    editor.change(URI, RENAME)
    assert editor.text(URI) == RENAMED
    yield editor.client, editor


async def next_edit(client: LanguageClient, line: int, character: int, version: int = 2) -> object:
    params = {"textDocument": {"uri": URI, "version": version}, "position": {"line": line, "character": character}}
    return await asyncio.wait_for(client.protocol.send_request_async("diffgemma/nextEdit", params), 60)


def plain(value: object) -> object:
    """A custom request's result as JSON values (pygls hands it over as objects with attributes)."""
    if hasattr(value, "_asdict"):
        return {key: plain(item) for key, item in value._asdict().items()}
    if isinstance(value, list | tuple):
        return [plain(item) for item in value]
    if isinstance(value, dict):
        return {key: plain(item) for key, item in value.items()}
    return value


async def actions_at(client: LanguageClient, line: int) -> list[types.CodeAction]:
    result = await client.text_document_code_action_async(
        types.CodeActionParams(
            text_document=types.TextDocumentIdentifier(uri=URI),
            range=span(line, 4, line, 4),
            context=types.CodeActionContext(diagnostics=[], trigger_kind=types.CodeActionTriggerKind.Invoked),
        )
    )
    return [action for action in result or [] if isinstance(action, types.CodeAction)]


async def test_the_next_edit_is_the_renamed_parameters_use_and_its_action_applies_it(shared: RewritesServer) -> None:
    engine = Rewrites(answer=FOLLOWED)
    engine.release.set()
    async with session(shared, engine) as (client, editor):
        suggestion = plain(await next_edit(client, 0, 13))
        assert suggestion == {
            "uri": URI,
            "version": 2,
            "edits": [
                {
                    "range": {"start": {"line": 1, "character": 0}, "end": {"line": 2, "character": 0}},
                    "newText": "    return size * height\n",
                }
            ],
        }
        (sent,) = engine.rewrites()
        assert [segment.text for segment in sent.start] == [RENAMED]  # the window: every line, 10 each way
        assert sent.strength == pytest.approx(0.3)  # most of the window kept
        assert sent.candidates == 2  # two draws, which wrote the same edit (the fake engine lists no other)
        (action,) = [action for action in await actions_at(client, 1) if action.title == APPLY_TITLE]
        assert action.kind == APPLY_KIND and action.edit is not None
        assert editor.apply(action.edit).applied  # what the editor does with the action's edit
        assert editor.text(URI) == FOLLOWED
        assert not [action for action in await actions_at(client, 1) if action.title == APPLY_TITLE]  # text changed
        assert await next_edit(client, 0, 13, version=2) is None  # a version the document has left


async def test_a_document_not_edited_since_it_was_opened_has_no_next_edit_and_the_engine_is_not_asked(
    shared: RewritesServer,
) -> None:
    engine = Rewrites(answer=FOLLOWED)
    engine.release.set()
    async with session(shared, engine) as (client, editor):
        editor.close(URI)
        editor.open(URI, RENAMED)  # opened afresh: its edits went with the close
        assert await next_edit(client, 0, 13, version=1) is None
        assert engine.rewrites() == []


async def test_a_window_that_comes_back_unchanged_is_no_edit(shared: RewritesServer) -> None:
    engine = Rewrites(answer=RENAMED)
    engine.release.set()
    async with session(shared, engine) as (client, _):
        assert await next_edit(client, 1, 4) is None
        assert len(engine.rewrites()) == 1  # the engine was asked, and left the window as it was
        assert not [action for action in await actions_at(client, 1) if action.title == APPLY_TITLE]
        with pytest.raises(JsonRpcInvalidParams, match="position needs a line and a character"):
            await client.protocol.send_request_async(
                "diffgemma/nextEdit", {"textDocument": {"uri": URI, "version": 1}, "position": {"line": -1}}
            )


async def test_draws_that_write_different_edits_are_no_edit_unless_one_draw_is_enough(shared: RewritesServer) -> None:
    """``nextEditDraws`` (2 by default): the engine is asked for that many draws of the window, and an edit is
    suggested only when they all write it; with 1, whatever the one draw writes."""
    engine = Rewrites(answer=FOLLOWED)
    engine.alternatives = [FOLLOWED.replace("return size * height", "return size * size")]
    engine.release.set()
    async with session(shared, engine) as (client, _):
        assert await next_edit(client, 0, 13) is None
        (sent,) = engine.rewrites()
        assert sent.candidates == 2
        assert not [action for action in await actions_at(client, 1) if action.title == APPLY_TITLE]
    engine = Rewrites(answer=FOLLOWED)
    engine.alternatives = [FOLLOWED.replace("return size * height", "return size * size")]
    engine.release.set()
    async with session(shared, engine, nextEditDraws=1) as (client, _):
        suggestion = plain(await next_edit(client, 0, 13))
        assert isinstance(suggestion, dict) and suggestion["edits"][0]["newText"] == "    return size * height\n"
        assert engine.rewrites()[0].candidates == 1


async def test_draws_that_keep_disagreeing_are_explained_once(isolated_env: Path) -> None:
    """The shipped model's draws never agree, so no next edit ever appears: after ``UNSURE_NOTICE_AFTER`` requests
    the user is told why, once (a server of its own: once per server)."""
    engine = Rewrites(answer=FOLLOWED)
    engine.alternatives = [FOLLOWED.replace("return size * height", "return size * size")]
    engine.release.set()
    async with on_rewrites(isolated_env, engine) as own:
        async with session(own, engine) as (client, _):
            for _ in range(UNSURE_NOTICE_AFTER * 2):
                assert await next_edit(client, 0, 13) is None
            shown = [message.message for message in client.messages if "no next edit" in message.message]
            assert shown == [unsure_notice("fake", 2)] and "A real model makes next edits" in shown[0]
    assert "the shipped model is a small test model" in unsure_notice("default", 2)  # its handshake's model id


async def _rewrites_reach(engine: Rewrites, count: int) -> None:
    deadline = asyncio.get_running_loop().time() + 30
    while len(engine.rewrites()) < count:
        assert asyncio.get_running_loop().time() < deadline, f"{len(engine.rewrites())} rewrites, not {count}"
        await asyncio.sleep(0.05)


async def test_an_accepted_suggestion_has_the_next_one_computed_before_it_is_asked(shared: RewritesServer) -> None:
    """Issue 29's prefetch: the change that applies the suggestion starts the next one at once; the request for
    that version near it is answered by it, with no second call to the engine."""
    engine = Rewrites(answer=FOLLOWED)
    engine.release.set()
    async with session(shared, engine) as (client, editor):
        await next_edit(client, 0, 13)
        (action,) = [action for action in await actions_at(client, 1) if action.title == APPLY_TITLE]
        assert action.edit is not None and editor.apply(action.edit).applied
        await _rewrites_reach(engine, 2)  # asked by the server itself
        ahead = engine.rewrites()[1]
        assert [segment.text for segment in ahead.start] == [FOLLOWED] and ahead.strength == pytest.approx(0.3)
        assert await next_edit(client, 2, 0, version=editor.version(URI)) is None  # the window came back as it was
        assert len(engine.rewrites()) == 2  # the answer computed ahead, not a third call
        editor.change(URI, types.TextDocumentContentChangePartial(range=span(4, 0, 4, 0), text="# later\n"))
        fresh = plain(await next_edit(client, 2, 0, version=editor.version(URI)))
        assert isinstance(fresh, dict) and fresh["version"] == editor.version(URI)  # the fixed answer drops the line
        assert len(engine.rewrites()) == 3  # a version after the one computed ahead: asked anew


async def test_a_next_edit_computed_ahead_that_the_engine_superseded_is_computed_anew_when_asked(
    shared: RewritesServer,
) -> None:
    """The engine answers a request a newer one for the document replaced as superseded: that is no answer about
    the code, so the request for the version computed ahead asks the engine again, and gets the real answer."""
    engine = Rewrites(answer=FOLLOWED)
    engine.superseded = {1}  # the one computed ahead
    engine.release.set()
    async with session(shared, engine) as (client, editor):
        await next_edit(client, 0, 13)
        (action,) = [action for action in await actions_at(client, 1) if action.title == APPLY_TITLE]
        assert action.edit is not None and editor.apply(action.edit).applied
        await _rewrites_reach(engine, 2)
        assert editor.text(URI) == FOLLOWED
        engine.answer = FOLLOWED.replace("area(2, 3)", "area(3, 4)")
        found = plain(await next_edit(client, 2, 0, version=editor.version(URI)))
        assert isinstance(found, dict) and found["version"] == editor.version(URI)
        assert [edit["newText"] for edit in found["edits"]] == ["print(area(3, 4))\n"]
        assert len(engine.rewrites()) == 3  # asked anew, with the same window
        assert engine.rewrites()[2].start == engine.rewrites()[1].start


async def test_a_suggestion_the_user_did_not_take_starts_nothing_unless_asked_on_pauses(shared: RewritesServer) -> None:
    """Another change is not the suggestion taken: nothing is computed ahead. With ``nextEditOnPause`` (Helix, Zed)
    the server asks by itself once the burst of editing ends, and offers the answer as the code action."""
    engine = Rewrites(answer=FOLLOWED)
    engine.release.set()
    async with session(shared, engine) as (client, editor):
        await next_edit(client, 0, 13)
        editor.change(URI, types.TextDocumentContentChangePartial(range=span(4, 0, 4, 0), text="# later\n"))
        await asyncio.sleep(BURST_GAP_S + 1.0)  # a burst ended: nothing asked without the setting
        assert len(engine.rewrites()) == 1
    engine = Rewrites(answer=FOLLOWED)
    engine.release.set()
    async with session(shared, engine, nextEditOnPause=True) as (client, editor):
        editor.change(URI, types.TextDocumentContentChangePartial(range=span(4, 0, 4, 0), text="# later\n"))
        await _rewrites_reach(engine, 1)  # the server asked, once the burst ended
        deadline = asyncio.get_running_loop().time() + 30
        while not [action for action in await actions_at(client, 1) if action.title == APPLY_TITLE]:
            assert asyncio.get_running_loop().time() < deadline, "no action offered"
            await asyncio.sleep(0.1)
        assert plain(await next_edit(client, 1, 0, version=editor.version(URI))) is not None
        assert len(engine.rewrites()) == 1  # the request took the answer computed on the pause


async def test_a_second_did_open_forgets_the_next_edit_computed_ahead_for_the_old_text(shared: RewritesServer) -> None:
    """Issue 42, finding 1: a suggestion accepted, the next one computed ahead; the editor opens the uri again (no
    ``didClose``) with other text at the same version. The request for that version got the edits computed on the
    old text, and the plugin applied them over a line of the new file."""
    engine = Rewrites(answer=FOLLOWED)
    engine.release.set()
    async with session(shared, engine) as (client, editor):
        await next_edit(client, 0, 13)
        engine.answer = FOLLOWED.replace("area(2, 3)", "area(3, 4)")  # the edit computed ahead: line 4
        (action,) = [action for action in await actions_at(client, 1) if action.title == APPLY_TITLE]
        assert action.edit is not None and editor.apply(action.edit).applied
        await _rewrites_reach(engine, 2)
        version = editor.version(URI)
        other = "import os\n\n\ndef home():\n    return os.environ['HOME']\n"
        editor.open(URI, other, version=version)
        assert await next_edit(client, 4, 0, version=version) is None  # not edited since it was opened
        assert [action.title for action in await actions_at(client, 4)] == []


async def test_a_next_edit_never_supersedes_the_users_rewrite_of_the_document(shared: RewritesServer) -> None:
    """Issue 42, finding 4: the plugins ask for next edits on their own; one for a document whose rewrite is in
    flight superseded the rewrite in the engine (which keeps one request per document), and the user's rewrite
    ended with no edit and no message. The rewrite goes first: the next edit is "no edit" and is not sent."""
    engine = Rewrites(answer="def area(size, height):\n    return size * height")
    async with session(shared, engine) as (client, editor):
        whole = span(0, 0, 1, 25)
        pending = asyncio.ensure_future(rewrite(client, URI, whole, editor.version(URI)))
        await _rewrites_reach(engine, 1)
        assert await next_edit(client, 1, 4) is None
        assert len(engine.rewrites()) == 1 and engine.stopped == []  # not sent: the rewrite was not superseded
        engine.release.set()
        assert (await pending) == {"applied": True, "reason": ""}
        assert "return size * height" in editor.text(URI)


async def test_a_next_edit_never_supersedes_a_completion_the_user_invoked(shared: RewritesServer) -> None:
    """Issue 46: an invoked completion right after a change was superseded by the plugin's own next-edit request for
    the same document (Neovim sends one 300 ms after ``TextChanged``), and no menu came."""
    engine = Rewrites(answer=FOLLOWED)
    engine.completion_answer = "size * height"
    async with session(shared, engine) as (client, editor):
        editor.change(URI, types.TextDocumentContentChangePartial(range=span(1, 11, 1, 25), text=""))
        asked = asyncio.ensure_future(complete(client, URI, 1, 11))
        deadline = asyncio.get_running_loop().time() + 30
        while not engine.received:
            assert asyncio.get_running_loop().time() < deadline, "the completion never reached the engine"
            await asyncio.sleep(0.02)
        assert await next_edit(client, 1, 11, version=editor.version(URI)) is None
        assert engine.rewrites() == [] and engine.stopped == []  # not sent: the completion was not superseded
        engine.release.set()
        items = (await asyncio.wait_for(asked, 60)).items
        assert [item.text_edit.new_text for item in items if item.text_edit] == ["size * height"]
        completion = engine.received[0]
        assert await next_edit(client, 1, 0, version=editor.version(URI)) is not None  # and afterwards it is asked
        assert engine.received[0] is completion and len(engine.rewrites()) == 1
