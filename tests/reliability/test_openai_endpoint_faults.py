"""The OpenAI-compatible endpoint under hostile input: fuzzed bodies and headers, raw garbage on the socket,
many clients at once. Every request gets an answer (200 or a 4xx that says why), never a 500 or a hang, and the
endpoint keeps serving; its key file is private."""

from __future__ import annotations

import json
import os
import random
import socket
import stat
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.support.models import MEMORIZED_MIDDLE, MEMORIZED_PREFIX, MEMORIZED_SUFFIX
from tests.support.openai_endpoint import EXACT, Endpoint, post, running_endpoint
from tests.support.xdg import xdg_environment

FUZZED_REQUESTS = 400
GOOD = {"prompt": MEMORIZED_PREFIX, "suffix": MEMORIZED_SUFFIX}
JUNK: list[object] = [
    None,
    True,
    -1,
    0,
    2**63,
    1.5,
    "",
    "\ud800",
    "x" * 5000,
    [],
    {},
    [1, "a"],
    {"a": None},
    "<fim_prefix>",
]
FIELDS = ["prompt", "suffix", "max_tokens", "stop", "n", "stream", "echo", "model", "temperature", "best_of"]


@pytest.fixture(scope="module")
def endpoint(module_tmp: Path, memorized_model_dir: Path) -> Iterator[Endpoint]:
    with running_endpoint(memorized_model_dir, module_tmp, extra=EXACT, env=xdg_environment(module_tmp)) as server:
        yield server


def fuzzed_body(rng: random.Random) -> object:
    body: dict[str, object] = dict(GOOD)
    for _ in range(rng.randrange(1, 4)):
        body[rng.choice(FIELDS)] = rng.choice(JUNK)
    if rng.random() < 0.1:
        return rng.choice(JUNK)  # not even an object
    return body


def test_fuzzed_requests_get_clear_answers(endpoint: Endpoint) -> None:
    rng = random.Random(7)
    statuses: dict[int, int] = {}

    def one(index: int) -> int:
        local = random.Random(index)
        status, _, answer = post(endpoint.url, fuzzed_body(local), timeout=120)
        if status != 200:
            assert isinstance(answer, dict) and answer["error"]["message"], (status, answer)
        return status

    with ThreadPoolExecutor(8) as pool:  # eight clients at once
        for status in pool.map(one, [rng.randrange(10**9) for _ in range(FUZZED_REQUESTS)]):
            statuses[status] = statuses.get(status, 0) + 1
    print(f"endpoint fuzz: {FUZZED_REQUESTS} requests from 8 clients -> {dict(sorted(statuses.items()))}")
    assert set(statuses) <= {200, 400}, statuses
    assert statuses.get(200, 0) > 0 and statuses.get(400, 0) > 0
    status, _, answer = post(endpoint.url, GOOD)
    assert status == 200 and answer["choices"][0]["text"] == MEMORIZED_MIDDLE


def test_odd_authorization_headers_are_refused_cleanly(endpoint: Endpoint) -> None:
    for value in ["Bearer ünïcode", "Bearer", "Basic dXNlcjpwYXNz", "bearer  " + "x" * 5000, "Bearer \t"]:
        request = urllib.request.Request(
            endpoint.url, data=json.dumps(GOOD).encode(), method="POST", headers={"Authorization": value}
        )
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=30)
        assert refused.value.code == 401, value
    status, _, answer = post(endpoint.url, GOOD)
    assert status == 200 and answer["choices"][0]["text"] == MEMORIZED_MIDDLE


def test_raw_garbage_on_the_socket(endpoint: Endpoint) -> None:
    rng = random.Random(3)
    for payload in [
        b"\x00\xff" * 100,
        b"POST /v1/completions HTTP/1.1\r\nContent-Length: 99999999999\r\n\r\n",
        b"POST /v1/completions HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
        b"GET / HTTP/1.1\r\n" + b"X: " + b"a" * 100_000 + b"\r\n\r\n",
        bytes(rng.randrange(256) for _ in range(2000)),
    ]:
        with socket.create_connection(("127.0.0.1", endpoint.port), timeout=10) as connection:
            connection.sendall(payload)
            connection.shutdown(socket.SHUT_WR)
            reply = b""
            try:
                while chunk := connection.recv(65536):
                    reply += chunk
            except (ConnectionResetError, TimeoutError):
                pass
        assert not reply or reply.startswith(b"HTTP/1.") and b" 500 " not in reply.split(b"\r\n", 1)[0], reply[:200]
    status, _, answer = post(endpoint.url, GOOD)
    assert status == 200 and answer["choices"][0]["text"] == MEMORIZED_MIDDLE


def test_the_generated_key_file_is_private(tmp_path: Path) -> None:
    env = {key: value for key, value in os.environ.items() if key != "DIFFGEMMA_API_KEY"}
    env.update(xdg_environment(tmp_path))
    code = "from diffgemma_lsp.endpoint.server import load_api_key; print(*load_api_key())"
    first = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    second = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    key, where = first.stdout.split()
    assert len(key) >= 32 and second.stdout == first.stdout  # created once, then reused
    assert stat.S_IMODE(Path(where).stat().st_mode) == 0o600
    env["DIFFGEMMA_API_KEY"] = "from-the-environment"
    third = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert third.stdout.split() == ["from-the-environment", "$DIFFGEMMA_API_KEY"]


def test_it_listens_on_loopback_only(endpoint: Endpoint) -> None:
    listening = Path("/proc/net/tcp").read_text().splitlines()[1:]
    port_hex = f"{endpoint.port:04X}"
    ours = [line.split() for line in listening if line.split()[1].endswith(":" + port_hex)]
    assert ours and all(fields[1].startswith("0100007F:") for fields in ours), ours  # 127.0.0.1


def test_a_body_just_under_the_size_cap_is_a_clear_413(endpoint: Endpoint) -> None:
    body = {"prompt": "x" * (8 * 1024 * 1024 - 100), "suffix": ""}  # fits the body cap, not the engine's frame
    status, _, answer = post(endpoint.url, body)
    assert status == 413 and "too large for one request" in answer["error"]["message"], (status, answer)


def test_deeply_nested_json_is_a_clear_400(endpoint: Endpoint) -> None:
    for raw in [b"[" * 1000 + b"]" * 1000, b'{"prompt": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"]:
        status, _, answer = post(endpoint.url, None, raw=raw)
        assert status == 400 and "nested too deeply" in answer["error"]["message"], (status, answer)
    status, _, answer = post(endpoint.url, GOOD)
    assert status == 200 and answer["choices"][0]["text"] == MEMORIZED_MIDDLE
