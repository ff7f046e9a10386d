"""Refine as you type over real LSP, for the one-request-per-document rule (issue 45): a refine is a completion, so
the next keystroke's request supersedes the refine in flight, and the engine is told.

The real language server (a subprocess, driven by pytest-lsp's client) on a fake engine that speaks the real wire
(tests/support/fake_engine.py ``Rewrites``): it holds its answers until the test releases them, which a real engine
cannot be made to do, so that the second keystroke surely comes while the first refine is in flight. The refine
itself on a real engine: tests/e2e/test_refine_engine.py.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio
from lsprotocol import types
from pytest_lsp import LanguageClient

from diffgemma_engine.shared import protocol
from tests.support.fake_engine import Rewrites
from tests.support.lsp import Editor, RewritesServer, complete, on_rewrites, span

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="module")]
URI = "file:///work/add.py"
PREFIX = "def add(a, b):\n"
SHOWN = "    total = a + b\n    return total"
SUFFIX = "\n\nprint(add(1, 2))\n"
TYPED = "    total = a -"


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def shared(module_tmp: Path) -> AsyncIterator[RewritesServer]:
    """One server for the module's tests."""
    async with on_rewrites(module_tmp, Rewrites(SHOWN)) as server:
        yield server


@contextlib.asynccontextmanager
async def refining(shared: RewritesServer, engine: Rewrites) -> AsyncIterator[tuple[LanguageClient, Editor]]:
    """The shared server on ``engine`` with ``refineSteps`` 2, what the test before left open closed."""
    editor = shared.turn(engine, refineSteps=2)
    yield editor.client, editor


async def test_the_next_keystroke_supersedes_the_refine_in_flight(shared: RewritesServer) -> None:
    engine = Rewrites("    total = a - b\n    return total")
    engine.completion_answer = SHOWN
    engine.release.set()  # the first completion is answered at once
    async with refining(shared, engine) as (client, editor):
        editor.open(URI, PREFIX + SUFFIX)
        shown = await complete(client, URI, 1, 0)
        assert [item.text_edit.new_text for item in shown.items if item.text_edit] == [SHOWN]

        engine.release.clear()  # hold what comes next
        editor.change(URI, types.TextDocumentContentChangePartial(range=span(1, 0, 1, 0), text=TYPED))
        first = asyncio.ensure_future(complete(client, URI, 1, len(TYPED)))
        deadline = asyncio.get_running_loop().time() + 30
        while not engine.rewrites():
            assert asyncio.get_running_loop().time() < deadline, "the refine never reached the engine"
            await asyncio.sleep(0.02)
        [refine] = engine.rewrites()
        assert refine.prefix == PREFIX and refine.suffix == SUFFIX  # where the suggestion was offered
        assert refine.start == [
            protocol.StartSegment(text=TYPED, keep=True),  # the typed text, held
            protocol.StartSegment(text=" b\n    return total"),  # the shown text after it
        ]
        assert (refine.strength, refine.max_steps, refine.candidates) == (0.5, 4, 1)

        end = span(1, len(TYPED), 1, len(TYPED))
        editor.change(URI, types.TextDocumentContentChangePartial(range=end, text=" "))
        second = asyncio.ensure_future(complete(client, URI, 1, len(TYPED) + 1))
        while len(engine.rewrites()) < 2:
            assert asyncio.get_running_loop().time() < deadline, "the second refine never reached the engine"
            await asyncio.sleep(0.02)
        assert not (await first).items  # superseded: nothing shown for the older keystroke
        assert refine.id in engine.cancelled or (refine.id, protocol.StopReason.SUPERSEDED) in engine.stopped
        engine.release.set()
        assert [item.text_edit.new_text for item in (await second).items if item.text_edit] == ["b\n    return total"]


async def test_a_refine_that_keeps_nothing_after_the_typed_text_is_followed_by_a_new_completion(
    shared: RewritesServer,
) -> None:
    """The refine answers the shown text unchanged (it does not start with what was typed): the same keystroke
    asks a plain completion at the cursor, and its answer is shown, rather than nothing until the next keystroke."""
    engine = Rewrites(SHOWN)  # the refine comes back as the shown text: nothing of it follows the typed text
    engine.completion_answer = SHOWN
    engine.release.set()
    async with refining(shared, engine) as (client, editor):
        editor.open(URI, PREFIX + SUFFIX)
        await complete(client, URI, 1, 0)
        engine.completion_answer = " b\n    return total"
        editor.change(URI, types.TextDocumentContentChangePartial(range=span(1, 0, 1, 0), text=TYPED))
        shown = await complete(client, URI, 1, len(TYPED))
        assert [item.text_edit.new_text for item in shown.items if item.text_edit] == [" b\n    return total"]
        [first, refine, anew] = engine.received
        assert not first.start and refine.start and refine.refine
        assert not anew.start and anew.prefix == PREFIX + TYPED  # the plain completion at the cursor
