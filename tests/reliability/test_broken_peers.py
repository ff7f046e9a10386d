"""Broken engines and servers, played by small asyncio servers of this user's speaking the real wire protocol:
the language server must neither hang on them nor hammer them, nor flood the user with messages."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import pytest
from aiohttp import web

from diffgemma_engine.shared import frames, protocol
from diffgemma_lsp.backends.base import EngineUnavailable
from diffgemma_lsp.backends.local import ANSWER_SLACK_S, EngineClient, ExitCheck
from diffgemma_lsp.backends.remote import MAX_ANSWER_BYTES, OpenAIBackend
from tests.support.fake_engine import HELLO_OK, answering_empty, serving
from tests.support.lsp import RawLsp, server_command
from tests.support.openai_endpoint import serving_route

pytestmark = pytest.mark.e2e


async def _hello_then_drop(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await frames.read_message(reader)
    writer.write(frames.encode(HELLO_OK))
    await writer.drain()


async def _hello_then_silence(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await frames.read_message(reader)
    writer.write(frames.encode(HELLO_OK))
    await writer.drain()
    while True:  # reads every request and answers none (an engine stopped with SIGSTOP, or answering wrong ids)
        await frames.read_message(reader)


@pytest.fixture
def socket_dir(short_tmp: Path) -> Path:
    directory = short_tmp / "run"
    directory.mkdir(mode=0o700)
    return directory


async def _connected(path: Path) -> EngineClient:
    """A client of the engine at ``path``, once its handshake is done (or after 5 s)."""
    client = EngineClient(path)
    client.start()
    for _ in range(100):
        if client.hello is not None:
            break
        await asyncio.sleep(0.05)
    return client


async def test_an_engine_that_drops_every_connection_is_not_hammered(socket_dir: Path) -> None:
    path = socket_dir / "engine.sock"
    async with serving(path, _hello_then_drop) as connections:
        client = EngineClient(path)  # no engine to start: only reconnects
        client.start()
        await asyncio.sleep(4.0)
        await client.close()
        # Before: the backoff started over after every handshake, about 1,100 connections a second.
        assert 2 <= len(connections) <= 8, len(connections)
        print(f"engine dropping each connection: {len(connections)} connections in 4 s")


async def test_an_engine_that_never_answers_does_not_hold_a_request_forever(socket_dir: Path) -> None:
    path = socket_dir / "engine.sock"
    async with serving(path, _hello_then_silence):
        client = await _connected(path)
        started = time.monotonic()
        with pytest.raises(EngineUnavailable, match="did not answer"):
            request = protocol.Infill(id="1", uri="u", prefix="x", deadline_ms=500)
            await asyncio.wait_for(client.infill(request), 30)  # before: it waited forever
        waited = time.monotonic() - started
        assert waited < 0.5 + ANSWER_SLACK_S + 2, waited
        assert client.pending_count() == 0  # nothing left behind
        await client.close()


async def test_a_request_cancelled_as_its_answer_arrives_is_cancelled_not_answered(socket_dir: Path) -> None:
    """The answer read and the caller cancelled on the same turn of the loop (a rewrite the user cancelled as the
    engine finished it). Before: ``asyncio.wait_for`` (Python 3.11) returned the answer and dropped the cancel, so
    the rewrite's edit was applied after the editor had been told it was cancelled."""
    path = socket_dir / "engine.sock"
    async with serving(path, _hello_then_silence):
        client = await _connected(path)
        call = asyncio.ensure_future(client.infill(protocol.Infill(id="1", uri="u", prefix="x"), explicit=True))
        await asyncio.sleep(0.1)  # sent, and waiting for its answer
        assert client.pending_count() == 1
        client._deliver(protocol.Result(id="1", text="done", stop=protocol.StopReason.EOS))  # as its reader does
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        assert client.pending_count() == 0
        await client.close()


LATE_S = 0.5 + ANSWER_SLACK_S + 1.5
"""Past a 500 ms deadline and its slack: an engine whose floor of steps outlasts the deadline (the release on a CPU,
or three candidates in one batch) answers this late."""


async def _hello_then_late_answers(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await frames.read_message(reader)
    writer.write(frames.encode(HELLO_OK))
    await writer.drain()
    while True:
        message = await frames.read_message(reader)
        if isinstance(message, protocol.Infill):
            await asyncio.sleep(LATE_S)
            writer.write(frames.encode(protocol.Result(id=message.id, text="late", stop=protocol.StopReason.EOS)))
            await writer.drain()


async def test_a_request_the_user_asked_for_waits_for_an_answer_past_the_deadline(socket_dir: Path) -> None:
    """Before: an invoked completion (three candidates for the release-format checkpoint on this CPU, past its
    deadline by its floor of steps) came back empty after the deadline plus the slack, though the engine was
    working on it. A request typed into stays bounded by its deadline."""
    path = socket_dir / "engine.sock"
    async with serving(path, _hello_then_late_answers):
        client = await _connected(path)
        started = time.monotonic()
        result = await client.infill(protocol.Infill(id="1", uri="u", prefix="x", deadline_ms=500), explicit=True)
        assert result.text == "late" and time.monotonic() - started >= LATE_S
        with pytest.raises(EngineUnavailable, match="did not answer"):
            await client.infill(protocol.Infill(id="2", uri="u", prefix="x", deadline_ms=500))
        print(f"explicit request answered after {LATE_S:.1f} s; a typed one gave up at {0.5 + ANSWER_SLACK_S:.1f} s")
        await client.close()


async def test_a_flapping_engine_is_reported_once(socket_dir: Path) -> None:
    path = socket_dir / "engine.sock"
    uri = "file:///work/flap.py"
    async with serving(path, _hello_then_drop):
        lsp = await RawLsp.start(server_command(path, None))
        try:
            await lsp.initialize({"debounceMs": 0})
            lsp.open(uri, "def f():\n    ")
            params = {"textDocument": {"uri": uri}, "position": {"line": 0, "character": 2_200_001}}
            for request_id in range(10, 30):
                lsp.request(request_id, "textDocument/completion", params)
                assert (await lsp.reply(request_id))["result"]["items"] == []
                await asyncio.sleep(0.2)
            shown = [m for m in lsp.notifications if m["method"] == "window/showMessage"]
            assert len(shown) == 1, shown  # before: one per reconnection (16,828 in 15 s)
        finally:
            await lsp.stop()


async def test_a_huge_answer_from_a_completions_server_is_refused_unread() -> None:
    async def huge(_: web.Request) -> web.StreamResponse:
        text = "x" * (MAX_ANSWER_BYTES * 4)
        return web.json_response({"choices": [{"text": text, "finish_reason": "stop"}]})

    async with serving_route("/v1/completions", huge) as url:
        backend = OpenAIBackend(url, api_key_env="")
        try:
            with pytest.raises(Exception, match="more than"):
                await backend.infill(protocol.Infill(id="1", uri="u", prefix="x"))
        finally:
            await backend.close()


async def test_an_engine_that_exits_at_start_is_reported_with_its_reason_and_not_restarted(
    socket_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: the engine's error output was thrown away and it was started again every few seconds, forever;
    the user read "cannot reach the engine"."""
    import sys

    from diffgemma_lsp.backends import connect
    from diffgemma_lsp.backends.base import BackendState

    monkeypatch.setenv("XDG_STATE_HOME", str(socket_dir.parent / "state"))
    failing = [sys.executable, "-c", "import sys; sys.stderr.write('cannot listen: no space left'); sys.exit(4)"]
    monkeypatch.setattr(connect, "engine_command", lambda *_, **__: failing)
    starts: list[connect.StartedEngine] = []
    states: list[tuple[BackendState, str]] = []

    async def start_engine() -> ExitCheck:
        starts.append(connect.spawn_engine(socket_dir / "engine.sock", connect.EngineSettings()))
        return starts[-1].exit_reason

    client = EngineClient(
        socket_dir / "engine.sock", start_engine, lambda state, detail: states.append((state, detail))
    )
    client.start()
    await asyncio.sleep(3.0)
    await client.close()
    assert len(starts) == 1
    failed = [detail for state, detail in states if state is BackendState.FAILED]
    assert failed == ["the engine exited with status 4: cannot listen: no space left"], states
    with pytest.raises(EngineUnavailable, match="no space left"):
        await client.infill(protocol.Infill(id="1", uri="u", prefix="x"))


def test_an_unwritable_state_directory_moves_the_engines_log_not_its_start(
    short_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from diffgemma_lsp.backends import connect

    blocker = short_tmp / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("XDG_STATE_HOME", str(blocker / "state"))  # cannot be a directory, even for root
    folder = connect._log_folder()
    assert folder != connect.engine_log_path().parent and folder.is_dir()
    assert os.stat(folder).st_mode & 0o077 == 0  # a private temporary folder


async def test_a_request_over_the_frame_cap_is_an_empty_completion_not_a_traceback(socket_dir: Path) -> None:
    """The largest context the settings allow, of characters that JSON escapes to 12 bytes each (one lone
    surrogate makes the whole frame ASCII), does not fit one frame: the completion is empty, nothing waits for
    an answer that cannot come, and the next request is served."""
    path = socket_dir / "engine.sock"
    uri = "file:///work/wide.py"
    async with serving(path, answering_empty()):
        lsp = await RawLsp.start(server_command(path, None))
        try:
            await lsp.initialize({"debounceMs": 0, "contextTokens": 262_144, "extraContextTokens": 0})
            lsp.open(uri, "\U0001f600" * 1_100_000 + "\ud800")  # one line: the cursor at its end
            lsp.open("file:///work/small.py", "x = ")
            params = {"textDocument": {"uri": uri}, "position": {"line": 0, "character": 2_200_001}}
            small = {"textDocument": {"uri": "file:///work/small.py"}, "position": {"line": 0, "character": 4}}
            for request_id in (10, 11):
                lsp.request(request_id, "textDocument/completion", params)
                reply = await lsp.reply(request_id)
                assert "error" not in reply and reply["result"]["items"] == [], reply  # before: -32603, traceback
                lsp.request(request_id + 10, "textDocument/completion", small)
                assert (await lsp.reply(request_id + 10))["result"]["items"] == []  # answered by the engine
            logs = [m["params"]["message"] for m in lsp.notifications if m["method"] == "window/logMessage"]
            assert any("exceeds" in message for message in logs), logs
            assert not any("Traceback" in message for message in logs), logs
        finally:
            await lsp.stop()


DEEP = b"[" * 200_000 + b"]" * 200_000
HOSTILE_ANSWERS = [
    (400, DEEP),  # an error whose body is nested too deeply to parse
    (500, b'{"error": ' + DEEP + b"}"),
    (200, DEEP),
    (200, b'{"choices": ' + DEEP + b"}"),
    (200, b'{"choices": [1, 2, 3]}'),
    (200, b'{"choices": "text"}'),
    (200, b'{"choices": {"0": {"text": "x"}}}'),
    (200, b'{"choices": []}'),
    (200, b'{"choices": [[]]}'),
    (200, b'{"choices": [{"text": 5}]}'),
    (200, b'{"choices": [{"message": "hi"}]}'),
    (200, b'{"choices": [{"message": {"content": ["x"]}}]}'),
    (200, b'{"choices": [{"text": "ok"}, 7]}'),
    (200, b'{"choices": [{"text": "' + b"9" * 5000 + b'"}], "usage": {"prompt_tokens": ' + b"9" * 5000 + b"}}"),
]
"""Answers of a hostile (or broken) completions server, each at most a few hundred KB."""


async def test_a_hostile_completions_server_gets_a_clear_refusal_not_a_traceback(short_tmp: Path) -> None:
    """Before: deeply nested JSON (RecursionError) and choices that are not objects (AttributeError) ended the
    request in an ``internal`` error with a traceback."""
    answers = iter([*HOSTILE_ANSWERS, (200, b'{"choices": [{"text": "return a", "finish_reason": "stop"}]}')])

    async def hostile(_: web.Request) -> web.Response:
        status, body = next(answers)
        return web.Response(status=status, body=body, content_type="application/json")

    uri = "file:///work/remote.py"
    async with serving_route("/v1/completions", hostile) as url:
        lsp = await RawLsp.start(server_command(short_tmp / "unused.sock", None))
        try:
            settings = {"backend": "openai", "openaiUrl": url, "openaiApiKeyEnv": "UNSET_API_KEY", "debounceMs": 0}
            await lsp.initialize({"diffgemma": settings})
            lsp.open(uri, "def f(a):\n    ")
            params = {"textDocument": {"uri": uri}, "position": {"line": 1, "character": 4}}
            replies = []
            for request_id in range(10, 11 + len(HOSTILE_ANSWERS)):
                lsp.request(request_id, "textDocument/completion", params)
                replies.append(await lsp.reply(request_id))
            errors = [reply for reply in replies if "error" in reply]
            served = [item["textEdit"]["newText"] for item in replies[-1]["result"]["items"]]
            shown = [m["params"]["message"] for m in lsp.notifications if m["method"] == "window/showMessage"]
            logged = [m["params"]["message"] for m in lsp.notifications if m["method"] == "window/logMessage"]
            print(
                f"hostile completions server: {len(HOSTILE_ANSWERS)} bad answers, {len(errors)} error replies, "
                f"{len(shown)} message(s) shown; then served {served}"
            )
            assert errors == [], errors[0]["error"]["message"][:2000]
            assert all(reply["result"]["items"] == [] for reply in replies[:-1]), replies
            assert served == ["return a"], replies[-1]
            assert len(shown) == 1 and "HTTP 500" in shown[0], shown  # one outage: reported once
            assert not any("Traceback" in message for message in shown + logged), logged
        finally:
            await lsp.stop()
