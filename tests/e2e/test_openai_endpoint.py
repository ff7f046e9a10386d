"""The OpenAI-compatible endpoint (``diffgemma-lsp openai``), for real: its own engine process on a small
DiffusionGemma, a TCP socket on loopback, and Python's own HTTP client sending what Zed sends."""

from __future__ import annotations

import http.client
import json
import signal
import time
import tomllib
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from diffgemma_lsp.endpoint.server import DEFAULT_PORT
from diffgemma_lsp.fim_formats import format_named
from tests.conftest import xdg_environment
from tests.e2e.test_lsp_engine import _engine_pid, _kill_engine
from tests.support.models import MEMORIZED_MIDDLE, MEMORIZED_PREFIX, MEMORIZED_SUFFIX
from tests.support.openai_endpoint import API_KEY, EXACT, Endpoint, post, running_endpoint

pytestmark = pytest.mark.e2e
ZED = Path(__file__).resolve().parents[2] / "editors" / "zed"

# What Zed's edit predictions send with "provider": "open_ai_compatible_api" and "prompt_format": "star_coder"
# (crates/edit_prediction/src/fim.rs and open_ai_compatible.rs): a FIM prompt, its stop tokens, max_tokens 256.
ZED_REQUEST = {
    "model": "diffgemma",
    "prompt": f"<fim_prefix>{MEMORIZED_PREFIX}<fim_suffix>{MEMORIZED_SUFFIX}<fim_middle>",
    "max_tokens": 256,
    "temperature": None,
    "stop": ["<|endoftext|>", "<fim_prefix>", "<fim_middle>", "<fim_suffix>"],
    "environment": None,
}


SLOW = ["--steps", "250", "--deadline-ms", "0"]
"""250 steps on a model whose canvases never settle: each request takes seconds."""


@pytest.fixture(scope="module")
def endpoint(module_tmp: Path, memorized_model_dir: Path) -> Iterator[Endpoint]:
    """One endpoint and engine for the tests that do not break them (each test checks it still serves)."""
    with running_endpoint(memorized_model_dir, module_tmp, extra=EXACT, env=xdg_environment(module_tmp)) as server:
        yield server


def test_zeds_request_gets_the_models_middle(endpoint: Endpoint) -> None:
    status, headers, body = post(endpoint.url, ZED_REQUEST)
    assert status == 200, body
    assert headers["Content-Type"].startswith("application/json")
    assert body["object"] == "text_completion" and body["id"].startswith("cmpl-")
    assert body["choices"][0]["text"] == MEMORIZED_MIDDLE  # what Zed inserts at the cursor
    assert body["choices"][0]["finish_reason"] == "stop"
    assert body["model"].endswith(endpoint_model_name(endpoint))
    assert body["usage"]["completion_tokens"] > 0 and body["usage"]["prompt_tokens"] > 0


def endpoint_model_name(endpoint: Endpoint) -> str:
    status, _, body = get(endpoint, "/v1/models")
    assert status == 200
    return body["data"][0]["id"]


def get(endpoint: Endpoint, path: str, key: str | None = API_KEY) -> tuple[int, dict[str, str], object]:
    connection = http.client.HTTPConnection("127.0.0.1", endpoint.port, timeout=30)
    connection.request("GET", path, headers={"Authorization": f"Bearer {key}"} if key else {})
    response = connection.getresponse()
    return response.status, dict(response.headers), json.loads(response.read())


def test_the_shipped_zed_settings(endpoint: Endpoint) -> None:
    """editors/zed/settings.json points at the endpoint's port, in a format it reads; the request it makes works."""
    settings = json.loads((ZED / "settings.json").read_text())
    assert settings["edit_predictions"]["provider"] == "open_ai_compatible_api"
    provider = settings["edit_predictions"]["open_ai_compatible_api"]
    assert provider["api_url"] == f"http://127.0.0.1:{DEFAULT_PORT}/v1/completions"
    fmt = format_named(provider["prompt_format"])
    assert fmt is not None
    request = {
        "model": provider["model"],
        "prompt": fmt.build(MEMORIZED_PREFIX, MEMORIZED_SUFFIX),
        "max_tokens": provider["max_output_tokens"],
        "stop": ["<|endoftext|>", fmt.before, fmt.between, fmt.after][:4],
    }
    status, _, body = post(endpoint.url, request)
    assert status == 200 and body["choices"][0]["text"] == MEMORIZED_MIDDLE
    extension = tomllib.loads((ZED / "extension" / "extension.toml").read_text())
    assert "diffgemma-lsp" in extension["language_servers"]
    assert "Python" in extension["language_servers"]["diffgemma-lsp"]["languages"]


def test_other_prompt_formats_and_streaming(endpoint: Endpoint) -> None:
    # OpenAI's own infill shape: the prompt is the prefix, the suffix travels beside it.
    status, _, body = post(endpoint.url, {"prompt": MEMORIZED_PREFIX, "suffix": MEMORIZED_SUFFIX})
    assert status == 200 and body["choices"][0]["text"] == MEMORIZED_MIDDLE
    # Qwen / CodeGemma sentinels.
    prompt = f"<|fim_prefix|>{MEMORIZED_PREFIX}<|fim_suffix|>{MEMORIZED_SUFFIX}<|fim_middle|>"
    status, _, body = post(endpoint.url, {"prompt": prompt, "max_tokens": 64})
    assert status == 200 and body["choices"][0]["text"] == MEMORIZED_MIDDLE
    # A stop sequence cuts the text.
    status, _, body = post(endpoint.url, {"prompt": prompt, "stop": "\n"})
    assert status == 200 and body["choices"][0]["text"] == MEMORIZED_MIDDLE.split("\n")[0]
    assert body["choices"][0]["finish_reason"] == "stop"
    # n = 3: three canvases in one batch; this model answers the same three times, so one choice comes back.
    status, _, body = post(endpoint.url, dict(ZED_REQUEST, n=3))
    assert status == 200 and [choice["text"] for choice in body["choices"]] == [MEMORIZED_MIDDLE]
    # Server-sent events: one chunk, then [DONE].
    status, headers, text = post(endpoint.url, dict(ZED_REQUEST, stream=True))
    assert status == 200 and headers["Content-Type"].startswith("text/event-stream")
    events = [line.removeprefix("data: ") for line in text.split("\n\n") if line]
    assert events[-1] == "[DONE]" and MEMORIZED_MIDDLE.replace("\n", "\\n") in events[0]


def test_requests_without_the_key_are_refused(endpoint: Endpoint) -> None:
    for key in (None, "wrong-key", ""):
        status, headers, body = post(endpoint.url, ZED_REQUEST, key=key)
        assert status == 401, (key, body)
        assert headers.get("WWW-Authenticate") == "Bearer"
        assert "API key" in body["error"]["message"]
        assert "choices" not in body
    status, _, _ = get(endpoint, "/v1/models", key=None)
    assert status == 401
    assert "def add" not in endpoint.log()  # nothing of a refused request is logged


@pytest.mark.parametrize(
    ("body", "raw", "status", "says"),
    [
        (None, b"{not json", 400, "not valid JSON"),
        (None, b"\xff\xfe", 400, "not valid JSON"),
        ([1, 2], None, 400, "JSON object"),
        ({"model": "x"}, None, 400, "'prompt' is required"),
        ({"prompt": 3}, None, 400, "'prompt' is required"),
        ({"prompt": "x", "max_tokens": "many"}, None, 400, "'max_tokens' must be int"),
        ({"prompt": "x", "max_tokens": 0}, None, 400, "1 or more"),
        ({"prompt": "x", "stop": ["a", "b", "c", "d", "e"]}, None, 400, "up to 4"),
        ({"prompt": "x", "n": 9}, None, 400, "'n' must be between 1 and 4"),
        ({"prompt": "x", "echo": True}, None, 400, "'echo' is not supported"),
        (None, b'{"prompt": "' + b"x" * (9 * 1024 * 1024) + b'"}', 413, "too large"),
    ],
)
def test_bad_requests_get_a_clear_error_and_the_server_keeps_serving(
    endpoint: Endpoint, body: object, raw: bytes | None, status: int, says: str
) -> None:
    got, _, answer = post(endpoint.url, body, raw=raw)
    assert got == status, answer
    assert says.lower() in answer["error"]["message"].lower()
    got, _, answer = post(endpoint.url, ZED_REQUEST)
    assert got == 200 and answer["choices"][0]["text"] == MEMORIZED_MIDDLE


def test_unknown_routes_and_methods(endpoint: Endpoint) -> None:
    assert get(endpoint, "/v1/chat")[0] == 404
    assert get(endpoint, "/v1/completions")[0] == 405


def test_an_engine_that_dies_mid_request(isolated_env: Path, random_model_dir: Path) -> None:
    """The request in flight gets a 503 that says why; the endpoint starts a new engine and serves again."""
    with running_endpoint(random_model_dir, isolated_env, extra=SLOW) as server:
        socket_path = server.socket_path
        with ThreadPoolExecutor(1) as pool:
            pending = pool.submit(post, server.url, {"prompt": "def f():\n    "})
            time.sleep(0.3)  # the engine has started on it (250 steps take 0.9 s or more here)
            old = _kill_engine(socket_path, signal.SIGKILL)
            assert old is not None
            status, headers, body = pending.result(timeout=60)
        assert status == 503, body
        assert "engine" in body["error"]["message"] and "retry" in body["error"]["message"]
        deadline = time.monotonic() + 120
        while True:
            status, _, body = post(server.url, {"prompt": "x = ", "max_tokens": 1}, timeout=120)
            if status == 200 or time.monotonic() > deadline:
                break
            assert status == 503, body  # loading: "retry shortly", never a hang or a 500
            time.sleep(0.5)
        assert status == 200, body
        assert _engine_pid(socket_path) not in (None, old)
        print(f"engine killed mid-request: 503 for the request in flight, served again by a new engine: {body}")


def test_a_client_that_hangs_up_cancels_the_engines_work(isolated_env: Path, random_model_dir: Path) -> None:
    with running_endpoint(random_model_dir, isolated_env, extra=SLOW) as server:
        connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
        connection.request(
            "POST",
            "/v1/completions",
            body=b'{"prompt": "def f():\\n    "}',
            headers={"Authorization": f"Bearer {API_KEY}", "Content-Type": "application/json"},
        )
        time.sleep(0.3)  # the engine has started on it (250 steps take 0.9 s or more here)
        dropped = time.monotonic()
        connection.close()  # the user typed on: the editor drops the request
        # The engine stops denoising it (250 steps would take many seconds) and counts it as cancelled.
        while (stats := _engine_stats(server.socket_path)).replies.get("cancelled", 0) < 1:
            assert time.monotonic() - dropped < 60, stats
            time.sleep(0.2)
        assert stats.replies.get("length", 0) + stats.replies.get("eos", 0) == 0  # it did not run to the end
        print(f"dropped request cancelled in the engine {time.monotonic() - dropped:.2f} s after the hang-up")


def _engine_stats(socket_path: Path):
    import asyncio

    from diffgemma_engine.shared import frames, protocol

    async def ask() -> protocol.Stats:
        reader, writer = await asyncio.open_unix_connection(str(socket_path))
        writer.write(frames.encode(protocol.Hello(protocol=protocol.PROTOCOL_VERSION, client="test")))
        await frames.read_message(reader)
        writer.write(frames.encode(protocol.GetStats(id="s")))
        while not isinstance(message := await frames.read_message(reader), protocol.Stats):
            pass
        writer.close()
        return message

    return asyncio.run(ask())
