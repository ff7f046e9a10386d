"""The editors' ``model`` setting as a hub id: the real language server starts the real engine on the id, which
loads the snapshot ``diffgemma-engine pull`` put in huggingface_hub's cache, asking nothing of the hub.

The hub is a stand-in (``tests.support.hub``): no machine here reaches the Hugging Face Hub, so the real
huggingface_hub client talks HTTP to a local server serving the release-format checkpoint under the release's
id."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from diffgemma_engine.shared import socket_paths
from tests.e2e.test_lsp_engine import _engine_pid, _kill_engine
from tests.support.hub import serve_hub
from tests.support.lsp import complete_when_ready, open_document, start_client
from tests.support.release_format import ANSWERED_PREFIX, ANSWERED_SUFFIX, INSERTED

pytestmark = pytest.mark.e2e
RELEASE_ID = "google/diffusiongemma-26B-A4B-it"
URI = "file:///work/example.py"


async def test_a_hub_id_in_the_model_setting_serves_completions_from_the_cache(
    isolated_env: Path, release_memorized_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with serve_hub({RELEASE_ID: release_memorized_dir}) as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        monkeypatch.setenv("HF_HOME", str(isolated_env / "hf"))
        for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_HUB_CACHE", "HF_TOKEN"):
            monkeypatch.delenv(name, raising=False)  # the engine goes offline by itself
        pull = [sys.executable, "-m", "diffgemma_engine", "pull", RELEASE_ID]
        pulled = await asyncio.to_thread(subprocess.run, pull, capture_output=True, text=True, timeout=300)
        assert pulled.returncode == 0, pulled.stderr
        asked = len(hub.requests)

        socket_path = socket_paths.socket_path_for(RELEASE_ID)  # the id's own engine, as the server picks it
        client = await start_client(
            [sys.executable, "-m", "diffgemma_lsp", "--stdio"],
            # no deadline: on a loaded machine the step budget cuts the memorized answer short
            init_options={
                "diffgemma": {"debounceMs": 0, "deadlineMs": 0, "extraContextTokens": 0, "model": RELEASE_ID}
            },
        )
        try:
            open_document(client, URI, ANSWERED_PREFIX + ANSWERED_SUFFIX)
            result = await complete_when_ready(client, URI, 1, 0)
            assert [item.text_edit.new_text for item in result.items] == [INSERTED]
            assert _engine_pid(socket_path) is not None  # the server started the id's engine
            assert not [message for message in client.log_messages if "setting 'model'" in message.message]
        finally:
            await client.shutdown_session()
            _kill_engine(socket_path, signal.SIGTERM)
        assert len(hub.requests) == asked  # loaded from the cache with no network
