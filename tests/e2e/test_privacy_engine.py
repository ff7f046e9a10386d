"""Issue 42's done-when on a real engine: a workspace with a secret in every form (tests/support/private_workspace.py,
and a credentials file outside it), each opened and edited in the editor, sends none of them in any prompt. The real
language server completes in main.py through a tap on a real engine's socket (``fake_engine.relaying``), which records
every request the engine receives; each is then rendered as the engine renders it in both prompt layouts (fill in
the middle, with the engine's checkpoint's tokenizer; chat, with the release checkpoint's template), and no secret is
in either."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from transformers import AutoTokenizer

from diffgemma_engine.shared import protocol
from diffgemma_engine.shared.prompt import layout_for, parts_of
from tests.support.engine import EngineProcess, RawClient
from tests.support.fake_engine import relaying, serving
from tests.support.lsp import (
    complete,
    inline_complete,
    open_document,
    replace_text,
    server_command,
    span,
    start_client,
    until_ready,
)
from tests.support.private_workspace import (  # noqa: F401  (workspace: the fixture)
    MAIN,
    MARKERS,
    PRIVATE_FILES,
    with_main_and_credentials,
    workspace,
)

pytestmark = pytest.mark.e2e


async def test_no_secret_is_in_the_prompt_a_real_engine_renders_in_either_layout(
    isolated_env: Path,
    workspace: Path,  # noqa: F811
    random_model_dir: Path,
    release_tokenizer: Any,
) -> None:
    credentials = with_main_and_credentials(workspace)
    run = isolated_env / "run"
    run.mkdir(mode=0o700, exist_ok=True)
    engine = EngineProcess(random_model_dir, run / "engine.sock", isolated_env / "engine.log")
    sent: list[protocol.Message] = []
    last = MAIN.count("\n")
    try:
        await (await RawClient.connect(engine.socket_path)).close()  # loaded
        async with serving(run / "tap.sock", relaying(engine.socket_path, sent)):
            options = {"diffgemma": {"debounceMs": 0, "privateFiles": ["customer_*"], "steps": 2}}
            client = await start_client(server_command(run / "tap.sock", None), init_options=options, root=workspace)
            try:
                for path in [*(workspace / name for name in PRIVATE_FILES), workspace / "linked.py", credentials]:
                    open_document(client, path.as_uri(), path.read_text())
                    replace_text(client, path.as_uri(), 2, span(0, 0, 0, 0), "EDITED_IN_THE_EDITOR = 1\n")
                main = (workspace / "main.py").as_uri()
                open_document(client, main, MAIN)
                await until_ready(client)
                deadline = asyncio.get_running_loop().time() + 120
                while not _index_reached(sent):
                    assert asyncio.get_running_loop().time() < deadline, "the workspace index never reached a prompt"
                    await complete(client, main, last, 11)
                await inline_complete(client, main, last, 11)
                open_document(client, (workspace / ".env").as_uri(), "API_TOKEN=dotenv-secret\n")
                await complete(client, (workspace / ".env").as_uri(), 0, 10)
            finally:
                await client.shutdown_session()
    finally:
        engine.stop()
    infills = _infills(sent)
    assert infills and all(request.uri == main for request in infills)
    fim_tokenizer = AutoTokenizer.from_pretrained(random_model_dir)
    layouts = {"fim": fim_tokenizer, "chat": release_tokenizer}
    for name, tokenizer in layouts.items():
        layout = layout_for(tokenizer)
        rendered = [tokenizer.decode(layout.prompt(parts_of(request), 100_000).ids) for request in infills]
        assert any("def shared_helper" in text for text in rendered), name  # what the user shares is there
        leaked = {marker for text in rendered for marker in MARKERS if marker in text}
        assert leaked == set(), (name, leaked)


def _infills(sent: list[protocol.Message]) -> list[protocol.Infill]:
    return [message for message in sent if isinstance(message, protocol.Infill)]


def _index_reached(sent: list[protocol.Message]) -> bool:
    """Whether the last request held the shared helper's definition (the workspace index is built)."""
    infills = _infills(sent)
    return bool(infills) and any("def shared_helper" in chunk.text for chunk in infills[-1].extra)
