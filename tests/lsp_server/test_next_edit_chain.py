"""Issue 45's next edits that jump, in the real language server, on what the chain sends: a fake engine that rewrites
(tests/support/fake_engine.py ``Rewrites``) records the one request a rename's places go in (their windows), so that
what each window's prompt holds can be read. Privacy: no text of a file the user keeps private reaches a window's
prompt (its edits, its recently opened text), and nothing at all is sent for a chain in a secret document or with
a secret in a place's window. A place whose line is longer than a canvas is left out; the others still go."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio
from lsprotocol import types

from diffgemma_engine.shared import protocol
from diffgemma_lsp.features.selection import CHARS_PER_CANVAS_TOKEN
from tests.support.fake_engine import Rewrites
from tests.support.lsp import Editor, on_rewrites, reconfigured, span
from tests.support.next_edit_chain import CHAIN, FOLLOWED_LINES, RENAMED

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="module")]
URI = "file:///work/totals.py"
PRIVATE_MARKER = "customer_ledger_balance"
SHARED_MARKER = "shared_helper_total"
AWS_KEY = "AKIAIOSFODNN7EXAMPLE"


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def shared(module_tmp: Path) -> AsyncIterator[tuple[Rewrites, Editor]]:
    """One real server on a fake engine that rewrites (every rewrite answered at once), for the module's tests:
    none needs a server of its own (``chain_session`` closes what the test before left open)."""
    engine = Rewrites(answer=FOLLOWED_LINES[0])
    engine.release.set()
    async with on_rewrites(module_tmp, engine) as server:
        yield engine, server.editor


@contextlib.asynccontextmanager
async def chain_session(shared: tuple[Rewrites, Editor], **settings: object) -> AsyncIterator[Editor]:
    """The shared server with ``settings``, ``nextEditLines`` 1 (the window at the definition holds none of the uses)
    and the user's ``privateFiles`` pattern ``customer_*``; the engine's record of what it was sent starts empty."""
    engine, editor = shared
    engine.received.clear()
    yield reconfigured(editor, nextEditLines=1, privateFiles=["customer_*"], **settings)


async def renamed_and_asked(editor: Editor, uri: str, text: str) -> object:
    """``text`` opened at ``uri``, ``total`` renamed ``summed`` at its definition (CHAIN becomes RENAMED), then the
    next edit asked there."""
    editor.open(uri, text)
    editor.change(uri, types.TextDocumentContentChangePartial(range=span(0, 4, 0, 9), text="summed"))
    params = {"textDocument": {"uri": uri, "version": editor.version(uri)}, "position": {"line": 0, "character": 10}}
    return await asyncio.wait_for(editor.client.protocol.send_request_async("diffgemma/nextEdit", params), 60)


def prompt_texts(request: protocol.Infill) -> list[str]:
    """Everything of ``request`` that goes into a window's prompt: each window's text around it and start, and the
    chunks they share."""
    own = [request.prefix, request.suffix, *(segment.text for segment in request.start)]
    windows = [text for w in request.windows for text in (w.prefix, w.suffix, *(s.text for s in w.start))]
    return own + windows + [chunk.text for chunk in request.extra]


async def test_no_text_of_a_private_file_reaches_a_chain_windows_prompt(shared: tuple[Rewrites, Editor]) -> None:
    """A file the user keeps private (named by ``privateFiles``) open and edited beside a shared one: the chain's
    request (three places) carries the shared file's text and the rename, and nothing of the private file."""
    engine, _ = shared
    async with chain_session(shared, extraContextTokens=512) as editor:
        for name, marker in (("customer_ledger.py", PRIVATE_MARKER), ("helpers.py", SHARED_MARKER)):
            uri = f"file:///work/{name}"
            editor.open(uri, f"def {marker}():\n    return 0\n")
            editor.change(uri, types.TextDocumentContentChangePartial(range=span(1, 11, 1, 12), text="1"))
        await renamed_and_asked(editor, URI, CHAIN)
    (sent,) = engine.rewrites()
    assert len(sent.windows) == 2  # the chain: the first place, and the two others as windows
    texts = "\n".join(prompt_texts(sent))
    assert SHARED_MARKER in texts and "def summed(items):" in texts  # what the user shares goes
    assert PRIVATE_MARKER not in texts


async def test_a_chain_in_a_secret_document_or_with_a_secret_at_a_place_is_never_sent(
    shared: tuple[Rewrites, Editor],
) -> None:
    engine, _ = shared
    with_key = CHAIN.replace("third = total([5, 6])", f"third = total([5, 6])  # {AWS_KEY}")
    async with chain_session(shared) as editor:
        assert await renamed_and_asked(editor, "file:///work/customer_totals.py", CHAIN) is None  # by the setting
        assert await renamed_and_asked(editor, URI, with_key) is None  # a key at the third place
        assert engine.rewrites() == []
        editor.close(URI)
        assert await renamed_and_asked(editor, URI, CHAIN) is not None  # the same chain without either: asked
    (sent,) = engine.rewrites()
    assert len(sent.windows) == 2 and not any(AWS_KEY in text for text in prompt_texts(sent))


async def test_a_place_longer_than_a_canvas_is_left_out_and_the_others_still_go(
    shared: tuple[Rewrites, Editor],
) -> None:
    """A canvas of 32 tokens holds about 80 characters of a window: the second use's line is longer, so the chain
    is the first and the third place (before: all three went, and the engine refused the whole request)."""
    long_line = "second = total([3, 4]) + " + " + ".join(f"value_{n}" for n in range(12)) + "\n"
    assert len(long_line) > 32 * CHARS_PER_CANVAS_TOKEN
    text = CHAIN.replace("second = total([3, 4])\n", long_line)
    engine, _ = shared
    async with chain_session(shared, canvasLength=32) as editor:
        answer = await renamed_and_asked(editor, URI, text)
    assert answer is not None  # the first place, suggested
    (sent,) = engine.rewrites()
    assert [segment.text for segment in sent.start] == ["first = total([1, 2])\n"]
    assert [[segment.text for segment in window.start] for window in sent.windows] == [["third = total([5, 6])\n"]]
    assert RENAMED.replace("second = total([3, 4])\n", long_line) == editor.text(URI)
