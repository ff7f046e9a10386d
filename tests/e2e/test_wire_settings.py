"""The settings that shape a request reach the engine: the real language server completes through a tap on the
real engine's socket (``fake_engine.relaying``), which records every message the server sent it."""

from __future__ import annotations

from pathlib import Path

import pytest

from diffgemma_engine.shared import protocol
from tests.support.engine import EngineProcess, RawClient
from tests.support.fake_engine import relaying, serving
from tests.support.lsp import complete, inline_complete, open_document, server_command, start_client, until_ready
from tests.support.models import MEMORIZED_PREFIX, MEMORIZED_SUFFIX

pytestmark = pytest.mark.e2e
URI = "file:///work/wire.py"
SETTINGS = {"deadlineMs": 4321, "canvasLength": 24, "steps": 5, "candidates": 2}
"""Each unlike its default, so that a field left at the engine's default shows."""


async def test_the_request_settings_are_on_the_wire(isolated_env: Path, memorized_model_dir: Path) -> None:
    """Before: ``deadlineMs`` never left the language server (every completion ran without a deadline)."""
    run = isolated_env / "run"
    run.mkdir(mode=0o700, exist_ok=True)
    engine = EngineProcess(memorized_model_dir, run / "engine.sock", isolated_env / "engine.log")
    sent: list[protocol.Message] = []
    try:
        await (await RawClient.connect(engine.socket_path)).close()  # loaded
        async with serving(run / "tap.sock", relaying(engine.socket_path, sent)):
            options = {"diffgemma": {"debounceMs": 0, "extraContextTokens": 0, **SETTINGS}}
            client = await start_client(server_command(run / "tap.sock", None), init_options=options)
            try:
                open_document(client, URI, MEMORIZED_PREFIX + MEMORIZED_SUFFIX)
                await until_ready(client)
                await complete(client, URI, 1, 0)  # the menu: one canvas
                await inline_complete(client, URI, 1, 0)  # invoked inline: ``candidates`` canvases
            finally:
                await client.shutdown_session()
    finally:
        engine.stop()
    infills = [message for message in sent if isinstance(message, protocol.Infill)]
    fields = [(request.deadline_ms, request.canvas_length, request.max_steps) for request in infills]
    print(f"wire settings: {len(infills)} infills sent, (deadline_ms, canvas_length, max_steps) {fields}")
    assert [request.candidates for request in infills] == [1, SETTINGS["candidates"]]
    for request in infills:
        assert request.deadline_ms == SETTINGS["deadlineMs"], request
        assert request.canvas_length == SETTINGS["canvasLength"], request
        assert request.max_steps == SETTINGS["steps"], request
        assert request.prefix == MEMORIZED_PREFIX and request.suffix == MEMORIZED_SUFFIX
