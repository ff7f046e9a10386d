"""Issue 29's next edit on the real engine: the language server starts it on a checkpoint trained to make the next
edit of ``tests/support/next_edits.py`` (``build_next_edit``), the user renames a parameter, and the suggestion the
engine computes (the window's canvas started from the code there) is the rename's use below, offered for the
version asked and applied by the code action."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from lsprotocol import types
from pytest_lsp import LanguageClient

from diffgemma_lsp.features.next_edit import APPLY_TITLE
from tests.e2e.test_lsp_engine import lsp_session
from tests.support.lsp import Editor, span, until_ready
from tests.support.next_edits import AREA, AREA_NAME, FOLLOWED, RENAMED

pytestmark = pytest.mark.e2e
URI = f"file:///work/{AREA_NAME}"


async def next_edit(client: LanguageClient, line: int, character: int, version: int) -> object:
    params = {"textDocument": {"uri": URI, "version": version}, "position": {"line": line, "character": character}}
    async with asyncio.timeout(60):
        return await client.protocol.send_request_async("diffgemma/nextEdit", params)


async def test_after_a_rename_the_engine_suggests_its_use_and_the_code_action_applies_it(
    isolated_env: Path, next_edit_model_dir: Path
) -> None:
    async with lsp_session(isolated_env, next_edit_model_dir) as (client, _):
        editor = Editor(client)
        editor.open(URI, AREA)
        await until_ready(client)
        assert await next_edit(client, 0, 9, version=1) is None  # no edits yet: nothing follows
        editor.change(URI, types.TextDocumentContentChangePartial(range=span(0, 9, 0, 14), text="size"))
        assert editor.text(URI) == RENAMED
        suggestion = await next_edit(client, 0, 13, version=editor.version(URI))
        assert suggestion is not None, "the engine suggested no edit"
        assert suggestion.version == editor.version(URI)
        assert [(edit.range.start.line, edit.range.end.line, edit.newText) for edit in suggestion.edits] == [
            (1, 2, "    return size * height\n")
        ]
        actions = await client.text_document_code_action_async(
            types.CodeActionParams(
                text_document=types.TextDocumentIdentifier(uri=URI),
                range=span(1, 4, 1, 4),
                context=types.CodeActionContext(diagnostics=[], trigger_kind=types.CodeActionTriggerKind.Invoked),
            )
        )
        (action,) = [action for action in actions or [] if isinstance(action, types.CodeAction)]
        assert action.title == APPLY_TITLE and action.edit is not None
        assert editor.apply(action.edit).applied
        assert editor.text(URI) == FOLLOWED
        # The rename is complete: the engine, asked again at the new version, leaves the window as it is.
        assert await next_edit(client, 1, 11, version=editor.version(URI)) is None
