"""``backend = "openai"``: the real language server completes from an OpenAI-compatible server over real HTTP,
here the project's own endpoint (``diffgemma-lsp openai``) with its engine on a small DiffusionGemma."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
from lsprotocol import types
from pytest_lsp import LanguageClient

from tests.conftest import xdg_environment
from tests.e2e.test_lsp_engine import _engine_pid, _kill_engine
from tests.support.lsp import complete, complete_when_ready, open_document, server_command, start_client
from tests.support.lsp import status as status_of
from tests.support.models import MEMORIZED_MIDDLE, MEMORIZED_PREFIX, MEMORIZED_SUFFIX
from tests.support.openai_endpoint import API_KEY, EXACT, Endpoint, free_port, running_endpoint, serving_route

pytestmark = pytest.mark.e2e
URI = "file:///work/remote.py"
SOURCE = MEMORIZED_PREFIX + MEMORIZED_SUFFIX
CURSOR = (1, 0)
KEY_ENV = "DIFFGEMMA_TEST_REMOTE_API_KEY"  # settings accept only names ending in API_KEY


def remote_settings(url: str, prompt_format: str = "suffix") -> dict[str, object]:
    return {
        "diffgemma": {
            "backend": "openai",
            "openaiUrl": url,
            "openaiApiKeyEnv": KEY_ENV,
            "openaiPromptFormat": prompt_format,
            "debounceMs": 0,
            "extraContextTokens": 0,
        }
    }


@pytest.fixture(scope="module")
def endpoint(module_tmp: Path, memorized_model_dir: Path) -> Iterator[Endpoint]:
    with running_endpoint(memorized_model_dir, module_tmp, extra=EXACT, env=xdg_environment(module_tmp)) as server:
        yield server


async def _lsp(isolated_env: Path, settings: dict[str, object]) -> tuple[LanguageClient, Path]:
    socket_path = isolated_env / "run" / "lsp-engine.sock"  # must stay unused: the backend is remote
    client = await start_client(server_command(socket_path, None), init_options=settings)
    open_document(client, URI, SOURCE)
    return client, socket_path


@pytest.mark.parametrize("prompt_format", ["suffix", "star_coder", "qwen"])
async def test_completions_come_from_the_remote_server(
    isolated_env: Path, endpoint: Endpoint, monkeypatch: pytest.MonkeyPatch, prompt_format: str
) -> None:
    monkeypatch.setenv(KEY_ENV, API_KEY)
    client, socket_path = await _lsp(isolated_env, remote_settings(endpoint.url, prompt_format))
    try:
        result = await complete_when_ready(client, URI, *CURSOR, timeout=30)
        assert [item.text_edit.new_text for item in result.items] == [MEMORIZED_MIDDLE]
        status = await status_of(client)
        assert status["backend"] == "openai" and status["engine"] == "ready", status
        assert status["model"] == endpoint_model(endpoint)
        assert _engine_pid(socket_path) is None  # no local engine was started
        assert len(client.messages) == 0, client.messages
    finally:
        await client.shutdown_session()


def endpoint_model(endpoint: Endpoint) -> str:
    from tests.e2e.test_openai_endpoint import endpoint_model_name

    return endpoint_model_name(endpoint)


async def test_a_refused_key_is_reported_once(
    isolated_env: Path, endpoint: Endpoint, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(KEY_ENV, "not-the-key")
    client, _ = await _lsp(isolated_env, remote_settings(endpoint.url))
    try:
        for _ in range(3):
            result = await complete(client, URI, *CURSOR)
            assert len(result.items) == 0
        assert len(client.messages) == 1, client.messages
        message = client.messages[0].message
        assert "HTTP 401" in message and KEY_ENV in message, message
    finally:
        await client.shutdown_session()


async def test_a_server_that_goes_away_mid_request(
    isolated_env: Path, memorized_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """It takes the request, then dies: an empty answer and one message; once a server is back, completions are."""
    monkeypatch.setenv(KEY_ENV, API_KEY)
    port = free_port()
    took_request = asyncio.Event()

    async def accept_then_die(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        took_request.set()
        await asyncio.sleep(0.5)
        writer.transport.abort()  # no reply: the connection just ends

    dying = await asyncio.start_server(accept_then_die, "127.0.0.1", port)
    url = f"http://127.0.0.1:{port}/v1/completions"
    client, _ = await _lsp(isolated_env, remote_settings(url))
    endpoint: Endpoint | None = None
    socket_path = isolated_env / "run" / "endpoint-engine.sock"
    try:
        result = await complete(client, URI, *CURSOR)
        assert took_request.is_set()
        assert len(result.items) == 0
        dying.close()
        await dying.wait_closed()
        result = await complete(client, URI, *CURSOR)  # nothing listens now
        assert len(result.items) == 0
        assert len(client.messages) == 1, client.messages
        assert "unreachable" in client.messages[0].message
        # A real server comes up on the same address.
        endpoint = await asyncio.to_thread(
            Endpoint, memorized_model_dir, socket_path, isolated_env / "endpoint.log", port, EXACT
        )
        await asyncio.to_thread(endpoint.wait_ready)
        result = await complete(client, URI, *CURSOR)
        assert [item.text_edit.new_text for item in result.items] == [MEMORIZED_MIDDLE]
        assert any("is back" in log.message for log in client.log_messages), client.log_messages
        assert len(client.messages) == 1
    finally:
        await client.shutdown_session()
        if endpoint is not None:
            endpoint.stop()
        _kill_engine(socket_path, signal.SIGTERM)


async def test_switching_the_backend_takes_effect_without_a_restart(
    isolated_env: Path, endpoint: Endpoint, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(KEY_ENV, API_KEY)
    dead_url = f"http://127.0.0.1:{free_port()}/v1/completions"
    client, _ = await _lsp(isolated_env, remote_settings(dead_url))
    try:
        assert len((await complete(client, URI, *CURSOR)).items) == 0
        client.workspace_did_change_configuration(
            types.DidChangeConfigurationParams(settings=remote_settings(endpoint.url))
        )
        result = await complete_when_ready(client, URI, *CURSOR, timeout=30)
        assert [item.text_edit.new_text for item in result.items] == [MEMORIZED_MIDDLE]
    finally:
        await client.shutdown_session()


async def test_openai_backend_without_a_url_says_so(isolated_env: Path) -> None:
    settings = remote_settings("")
    client, socket_path = await _lsp(isolated_env, settings)
    try:
        assert len((await complete(client, URI, *CURSOR)).items) == 0
        assert len(client.messages) == 1 and "openaiUrl" in client.messages[0].message
        assert _engine_pid(socket_path) is None
    finally:
        await client.shutdown_session()


async def test_an_instruction_model_is_asked_through_chat_completions(
    isolated_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``openaiPromptFormat = "chat"`` (DiffusionGemma-IT on vLLM, which refuses ``suffix``): the request is the
    engine's own chat instruction with thinking off, and the fenced, explained answer reaches the editor as code.
    The server here answers as vLLM's ``/v1/chat/completions`` does and records what it was sent."""
    from aiohttp import web

    from diffgemma_engine.shared.prompt import PromptParts, chat_user_text

    monkeypatch.setenv(KEY_ENV, "remote-key")
    bodies: list[dict[str, object]] = []
    headers: list[str] = []

    async def chat(request: web.Request) -> web.Response:
        bodies.append(await request.json())
        headers.append(request.headers.get("Authorization", ""))
        answer = "Here is the missing code:\n```python\n    return a + b\n```\nIt adds the two numbers."
        return web.json_response(
            {
                "id": "chatcmpl-1",
                "object": "chat.completion",
                "model": "google/diffusiongemma-26B-A4B-it",
                "choices": [{"index": 0, "message": {"role": "assistant", "content": answer}, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 120, "completion_tokens": 20, "total_tokens": 140},
            }
        )

    async with serving_route("/v1/chat/completions", chat) as url:
        settings = remote_settings(url, "chat")
        settings["diffgemma"]["openaiModel"] = "google/diffusiongemma-26B-A4B-it"  # type: ignore[index]
        client, _ = await _lsp(isolated_env, settings)
        try:
            result = await complete_when_ready(client, URI, *CURSOR, timeout=30)
            assert [item.text_edit.new_text for item in result.items] == ["    return a + b"]
            user = chat_user_text(PromptParts(prefix=MEMORIZED_PREFIX, suffix=MEMORIZED_SUFFIX, language="python"))
            assert bodies[0] == {  # no max_tokens: the server's canvas is the model's own (256 for the release)
                "stream": False,
                "model": "google/diffusiongemma-26B-A4B-it",
                "messages": [{"role": "user", "content": user}],
                "chat_template_kwargs": {"enable_thinking": False},
            }
            assert headers[0] == "Bearer remote-key"
        finally:
            await client.shutdown_session()
