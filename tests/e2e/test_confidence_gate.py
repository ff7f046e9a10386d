"""``minConfidence`` end to end: the real language server and its real engine, the model's confidence in each
character on the wire (``Result.confidence``) carried through post-processing to the gate.

The random-weight checkpoint is sure of nothing (its canvas never settles): at ``minConfidence`` 0 its suggestion is
shown as before, above what it is sure of an invoked completion shows nothing and says why, and a rewrite is not
applied and says why. The memorized checkpoint is sure of its answer: shown whole at the same threshold."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from lsprotocol import types
from pytest_lsp import LanguageClient

from tests.e2e.test_lsp_engine import lsp_session
from tests.support.lsp import Editor, complete, complete_when_ready, rewrite, span
from tests.support.models import MEMORIZED_MIDDLE, MEMORIZED_PREFIX, MEMORIZED_SUFFIX

pytestmark = pytest.mark.e2e
URI = "file:///work/example.py"
SOURCE = MEMORIZED_PREFIX + MEMORIZED_SUFFIX
CURSOR = (1, 0)
QUIET = {"debounceMs": 0, "extraContextTokens": 0}


def _configure(client: LanguageClient, min_confidence: float) -> None:
    client.workspace_did_change_configuration(
        types.DidChangeConfigurationParams(settings={**QUIET, "minConfidence": min_confidence})
    )


async def _message(client: LanguageClient, part: str) -> str:
    """The last message to the user (``window/showMessage``) that holds ``part``, waited for."""
    for _ in range(200):
        found = [message.message for message in client.messages if part in message.message]
        if found:
            return found[-1]
        await asyncio.sleep(0.1)
    raise AssertionError(f"no message with {part!r}: {[m.message for m in client.messages]}")


async def test_an_unsure_suggestion_is_withheld_and_an_unsure_rewrite_not_applied(
    isolated_env: Path, random_model_dir: Path
) -> None:
    async with lsp_session(isolated_env, random_model_dir, minConfidence=0.0) as (client, _):
        editor = Editor(client)
        editor.open(URI, SOURCE)
        shown = await complete_when_ready(client, URI, *CURSOR)
        assert shown.items, "at minConfidence 0 the random model's text is shown, as before"
        _configure(client, 0.9)
        for _ in range(5):  # a random canvas may also leave nothing after post-processing: then nothing is said
            assert not (await complete(client, URI, *CURSOR)).items
            if any("unsure" in message.message for message in client.messages):
                break
        said = await _message(client, "unsure")
        assert "minConfidence 0.9" in said and "no completion" in said, said
        selected = span(1, 0, 1, 0)  # the empty line: filled as an insertion at its place
        line = "    return a + b"
        editor.change(URI, types.TextDocumentContentChangePartial(range=selected, text=line))
        reasons = []
        for _ in range(6):  # a random canvas may leave nothing after post-processing: that is said otherwise
            answer = await rewrite(client, URI, span(1, 0, 1, len(line)), editor.version(URI))
            assert answer["applied"] is False, answer
            reasons.append(answer["reason"])
            if "unsure" in answer["reason"]:
                break
        assert "minConfidence 0.9" in reasons[-1] and "not applied" in reasons[-1], reasons
        assert editor.text(URI) == MEMORIZED_PREFIX + line + MEMORIZED_SUFFIX  # the working code left as it was
        assert "not applied" in await _message(client, "not applied")


async def test_a_sure_answer_is_shown_whole_at_the_same_threshold(
    isolated_env: Path, memorized_model_dir: Path
) -> None:
    async with lsp_session(isolated_env, memorized_model_dir, minConfidence=0.9) as (client, _):
        Editor(client).open(URI, SOURCE)
        result = await complete_when_ready(client, URI, *CURSOR)
        assert [item.text_edit.new_text for item in result.items if item.text_edit] == [MEMORIZED_MIDDLE]
