"""Refine as you type through the real language server and the real engine (issue 45, part 1).

The memorized checkpoint shows its middle at the cursor; the user types into it something it does not start with
(``    total = a -`` where it shows ``a + b``). With ``refineSteps`` the server does not throw the suggestion away: the
engine gets a rewrite of it where it was offered, the typed characters held, for ``refineSteps`` steps (its log
says so), and the suggestion shown is what follows the typed text. With ``refineSteps`` 0 the same keystroke asks
a new completion from noise. One engine and one server; the setting changes between the two.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from lsprotocol import types
from pytest_lsp import LanguageClient

from tests.support.engine import EngineProcess
from tests.support.lsp import complete, complete_when_ready, open_document, server_command, start_client
from tests.support.models import MEMORIZED_MIDDLE, MEMORIZED_PREFIX, MEMORIZED_SUFFIX

pytestmark = pytest.mark.e2e
URI = "file:///work/example.py"
TYPED = MEMORIZED_MIDDLE[: MEMORIZED_MIDDLE.index("+")] + "-"
"""``    total = a -``: the shown suggestion has ``+`` there."""
SETTINGS = {"debounceMs": 0, "extraContextTokens": 0, "editHistoryTokens": 0}
"""No edit history in the prompt: the checkpoint answers its memorized middle to the document alone."""
ANSWERED = re.compile(r"request (\d+): (\w+), (\d+) steps.*")
REFINED = re.compile(r"request (\d+): (\w+), (\d+) steps.*\(a rewrite at strength ([0-9.]+)\)")


@pytest.fixture
async def lsp(short_tmp: Path, memorized_model_dir: Path) -> AsyncIterator[tuple[LanguageClient, EngineProcess]]:
    engine = EngineProcess(memorized_model_dir, short_tmp / "engine.sock", short_tmp / "engine.log")
    try:
        client = await start_client(
            server_command(engine.socket_path, None), init_options={"diffgemma": {**SETTINGS, "refineSteps": 2}}
        )
        try:
            yield client, engine
        finally:
            await client.shutdown_session()
    finally:
        engine.stop()


def edit_line_start(client: LanguageClient, version: int, text: str, replacing: int = 0) -> None:
    """Line 1's first ``replacing`` characters replaced by ``text`` (typed, or deleted)."""
    where = types.Range(start=types.Position(line=1, character=0), end=types.Position(line=1, character=replacing))
    client.text_document_did_change(
        types.DidChangeTextDocumentParams(
            text_document=types.VersionedTextDocumentIdentifier(uri=URI, version=version),
            content_changes=[types.TextDocumentContentChangePartial(range=where, text=text)],
        )
    )


async def logged(engine: EngineProcess, count: int, pattern: re.Pattern[str] = ANSWERED) -> list[re.Match[str]]:
    """The engine's answers (``pattern``) so far, once there are ``count`` (it writes each just after it answers)."""
    for _ in range(400):
        found = list(pattern.finditer(engine.log()))
        if len(found) >= count:
            return found
        await asyncio.sleep(0.05)
    raise AssertionError(f"the engine logged fewer than {count} answers:\n{engine.log()[-3000:]}")


def texts(result: types.CompletionList) -> list[str]:
    return [item.text_edit.new_text for item in result.items if item.text_edit is not None]


async def test_typing_into_a_suggestion_refines_it_with_the_typed_text_held(
    lsp: tuple[LanguageClient, EngineProcess],
) -> None:
    client, engine = lsp
    open_document(client, URI, MEMORIZED_PREFIX + MEMORIZED_SUFFIX)
    assert texts(await complete_when_ready(client, URI, 1, 0)) == [MEMORIZED_MIDDLE]
    edit_line_start(client, 2, TYPED)
    refined = await complete(client, URI, 1, len(TYPED))
    [rewrite] = await logged(engine, 1, REFINED)  # a rewrite of the shown text, not a completion from noise
    assert rewrite.group(4) == "0.5" and 1 <= int(rewrite.group(3)) <= 2, rewrite.group(0)  # refineSteps of it
    [suggestion] = texts(refined)
    assert suggestion.strip() and not suggestion.startswith(TYPED.strip()), suggestion  # what follows the typed text

    # refineSteps 0: the same keystroke into the same suggestion asks a new completion, from noise
    client.workspace_did_change_configuration(
        types.DidChangeConfigurationParams(settings={"diffgemma": {**SETTINGS, "refineSteps": 0}})
    )
    answered = len(await logged(engine, 2))
    edit_line_start(client, 3, "", replacing=len(TYPED))
    assert texts(await complete(client, URI, 1, 0)) == [MEMORIZED_MIDDLE]
    edit_line_start(client, 4, TYPED)
    await complete(client, URI, 1, len(TYPED))
    answers = await logged(engine, answered + 2)
    assert REFINED.fullmatch(answers[-1].group(0)) is None, answers[-1].group(0)
    assert len(REFINED.findall(engine.log())) == 1, engine.log()[-3000:]
