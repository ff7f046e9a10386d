"""Issue 45's next edits that jump on the real engine, through code actions only, as Helix offers them: the language
server starts its engine on a checkpoint trained for the chain of ``tests/support/next_edit_chain.py``, the user
renames a function, and once the typing pauses (``nextEditOnPause``) the server computes the three places of its
uses in one request; "Apply suggested edit (line N)" is offered wherever the cursor is, each applied in turn, the
next one offered at once from what was computed (the engine's request log holds the one request)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from lsprotocol import types
from pytest_lsp import LanguageClient

from diffgemma_lsp.features.next_edit import APPLY_TITLE
from tests.e2e.test_lsp_engine import lsp_session
from tests.support.lsp import Editor, span, until_ready
from tests.support.next_edit_chain import CHAIN, CHAIN_NAME, PLACE_LINES, RENAMED, STEPS

pytestmark = pytest.mark.e2e
URI = f"file:///work/{CHAIN_NAME}"


async def apply_action(client: LanguageClient) -> list[str]:
    """The titles of the next-edit actions offered with the cursor on the first line (waited for)."""
    async with asyncio.timeout(60):
        while True:
            actions = await client.text_document_code_action_async(
                types.CodeActionParams(
                    text_document=types.TextDocumentIdentifier(uri=URI),
                    range=span(0, 4, 0, 4),
                    context=types.CodeActionContext(diagnostics=[], trigger_kind=types.CodeActionTriggerKind.Invoked),
                )
            )
            offered = [action for action in actions or [] if isinstance(action, types.CodeAction)]
            if offered:
                return offered  # type: ignore[return-value]
            await asyncio.sleep(0.2)


def requests_logged(isolated_env: Path) -> list[str]:
    """The engine's next-edit requests (rewrites) in its log so far."""
    log = isolated_env / "xdg_state_home" / "diffgemma" / "engine.log"
    return [line for line in log.read_text().splitlines() if "a rewrite at strength" in line]


async def test_a_rename_chain_is_offered_and_applied_by_three_code_actions_from_one_batch(
    isolated_env: Path, next_edit_chain_model_dir: Path
) -> None:
    settings = {"nextEditOnPause": True, "nextEditLines": 1}
    async with lsp_session(isolated_env, next_edit_chain_model_dir, **settings) as (client, _):
        editor = Editor(client)
        editor.open(URI, CHAIN)
        await until_ready(client)
        editor.change(URI, types.TextDocumentContentChangePartial(range=span(0, 4, 0, 9), text="summed"))
        assert editor.text(URI) == RENAMED
        for line, after in zip(PLACE_LINES, STEPS, strict=True):
            (action,) = await apply_action(client)
            assert action.title == f"{APPLY_TITLE} (line {line + 1})" and action.edit is not None
            assert editor.apply(action.edit).applied
            assert editor.text(URI) == after
            (request,) = requests_logged(isolated_env)  # the one request: each later place was computed in it
            assert "(3 windows in one batch)" in request
