"""Issue 27: the engine's vLLM client (``diffgemma_engine.vllm.client``) against a server that parses and validates
every request with vLLM 0.33's own code and answers with vLLM's own response classes (tests/support/
vllm_standin.py: the one stand-in, for vLLM's GPU execution): health and version, a completion and a rewrite read
back, vLLM's refusal passed on with its message, a cancel that aborts the request in the server, and a socket in a
directory others can write refused before anything is sent."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import attrs
import pytest

from diffgemma_engine.loading.checkpoint_files import DEFAULT_MODEL_DIR
from diffgemma_engine.loading.model import LoadedModel, load_model
from diffgemma_engine.request.canvas_ask import canvas_ask
from diffgemma_engine.request.on_vllm import run_on_vllm
from diffgemma_engine.shared import protocol
from diffgemma_engine.shared.session_key import session_key
from diffgemma_engine.vllm.client import VllmError, VllmServer, wait_until_healthy
from diffgemma_engine.vllm.completions import (
    CACHED_UNREPORTED,
    STEPS_UNREPORTED,
    completion_body,
    read_reply,
    reply_bound,
)
from tests.support.engine import EngineProcess, RawClient

STANDIN = Path(__file__).resolve().parents[1] / "support" / "vllm_standin.py"


@pytest.fixture(scope="module")
def shipped() -> LoadedModel:
    return load_model(None)


@pytest.fixture(scope="module")
def standin(vllm_python: Path, shipped: LoadedModel) -> Iterator[tuple[VllmServer, Path]]:
    folder = Path(tempfile.mkdtemp(prefix="vllm-", dir="/tmp"))
    os.chmod(folder, 0o700)
    log = folder / "requests.jsonl"
    command = [str(vllm_python), str(STANDIN), "--socket", str(folder / "vllm.sock"), "--log", str(log)]
    command += ["--model", str(DEFAULT_MODEL_DIR), "--canvas", str(shipped.canvas_length), "--answer-ids", "5,6,1"]
    process = subprocess.Popen(command, stderr=subprocess.PIPE, text=True)
    server = VllmServer(socket_path=folder / "vllm.sock")
    alive = lambda: process.poll() is None  # noqa: E731
    assert wait_until_healthy(server, 300, alive), process.stderr.read() if process.stderr else ""
    yield server, log
    process.kill()
    process.wait()


def _requests(log: Path) -> list[dict]:
    """The requests the server answered, refused or dropped (not the notes of their arrival)."""
    return [entry for line in log.read_text().splitlines() if "ok" in (entry := json.loads(line))]


def _infill(**fields: object) -> protocol.Infill:
    values: dict[str, object] = {"id": "1", "uri": "file:///a.py", "prefix": "def add(a, b):\n    ", "seed": 3}
    values.update(fields)
    return protocol.Infill(**values)  # type: ignore[arg-type]


def test_health_version_and_a_completion(standin: tuple[VllmServer, Path], shipped: LoadedModel) -> None:
    server, log = standin
    assert server.healthy() and server.version() == "0.33.0"
    ask, _ = canvas_ask(shipped, _infill(candidates=2))
    body = completion_body(ask, model="default", served_canvas=shipped.canvas_length)
    reply, stopped = server.complete(body)
    assert stopped is None
    answer = read_reply(reply, candidates=2)
    assert [choice.token_ids for choice in answer.choices] == [[5, 6, 1], [5, 6, 1]]
    assert answer.prompt_tokens == len(ask.prompt_ids)
    assert _requests(log)[-1]["ok"] is True


def test_the_steps_vllm_ran_are_unknown_and_teach_the_step_clock_nothing(
    standin: tuple[VllmServer, Path], shipped: LoadedModel
) -> None:
    """Issue 41: vLLM stops a settled canvas early and its reply does not say when, so the step budget sent is not
    recorded as the steps run (the clock would learn a time per step several times too small); a server without
    ``--enable-prompt-tokens-details`` (this one) reports no cached share, which is said, not shown as 0."""
    server, _ = standin
    clock = shipped.serving.clock
    clock.step_ms.clear()
    notes: set[str] = set()
    (answer,) = run_on_vllm(shipped, _infill(), server, "default", notes=notes)
    assert answer.stop is protocol.StopReason.EOS and answer.timings.prompt_tokens > 0
    assert answer.timings.steps == 0 and clock.step_ms == {}
    assert notes == {STEPS_UNREPORTED, CACHED_UNREPORTED}


def test_a_rewrite_reaches_vllm_as_its_seed_canvas(standin: tuple[VllmServer, Path], shipped: LoadedModel) -> None:
    server, log = standin
    ask, laid = canvas_ask(shipped, _infill(start=[protocol.StartSegment(text="return a + b\n", keep=True)]))
    reply, _ = server.complete(completion_body(ask, model="default", served_canvas=shipped.canvas_length))
    (choice,) = read_reply(reply, candidates=1).choices
    assert choice.token_ids == ask.start_ids and laid.row is not None
    assert _requests(log)[-1]["extra_args"]["diffusion_pinned"] == ask.held != []


def test_vllms_refusal_comes_back_with_its_message(standin: tuple[VllmServer, Path], shipped: LoadedModel) -> None:
    server, _ = standin
    ask, _ = canvas_ask(shipped, _infill())
    body = completion_body(ask, model="default", served_canvas=shipped.canvas_length)
    body["vllm_xargs"]["diffusion_canvas_length"] = shipped.canvas_length + 1  # wider than served
    with pytest.raises(VllmError, match="diffusion_canvas_length must be a positive integer no larger"):
        server.complete(body)


def test_a_cancel_aborts_the_request_in_vllm(standin: tuple[VllmServer, Path], shipped: LoadedModel) -> None:
    server, log = standin
    server.request("POST", "/standin/delay", {"delay_s": 30})
    try:
        ask, _ = canvas_ask(shipped, _infill())
        body = completion_body(ask, model="default", served_canvas=shipped.canvas_length)
        started = time.monotonic()
        stop = lambda: "cancelled" if time.monotonic() - started > 0.5 else None  # noqa: E731
        reply, stopped = server.complete(body, should_stop=stop)
        assert (reply, stopped) == (None, "cancelled") and time.monotonic() - started < 10
        deadline = time.monotonic() + 10
        while not _requests(log)[-1].get("aborted") and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _requests(log)[-1]["aborted"] is True  # the server saw its client go and dropped the request
    finally:
        server.request("POST", "/standin/delay", {"delay_s": 0})


def test_a_socket_others_can_reach_is_refused_before_anything_is_sent(tmp_path: Path) -> None:
    folder = tmp_path / "open"
    folder.mkdir()
    os.chmod(folder, 0o777)
    with pytest.raises(VllmError, match="can be written by others"):
        VllmServer(socket_path=folder / "vllm.sock").complete({"prompt": [1]})
    assert not VllmServer(socket_path=folder / "vllm.sock").healthy()
    assert sys.platform.startswith("linux")


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        ([], "no `vllm` on PATH"),
        (["--vllm-socket", "/tmp/a.sock", "--vllm-url", "http://127.0.0.1:8000"], "give one"),
        (["--vllm-url", "http://127.0.0.1:8000", "--quantization", "int8"], "--quantization: options of the engine's"),
        (["--vllm-url", "http://gpu-box:8000"], "unencrypted to another machine; use https://"),
        (
            ["--vllm-url", "http://me:hunter2@10.0.0.5:8000/v1"],
            "--vllm-url http://me:***@10.0.0.5:8000/v1: completions",
        ),
    ],
    ids=["no-vllm", "two-servers", "own-loop-option", "plain-http-elsewhere", "password-redacted"],
)
def test_serve_runtime_vllm_refuses_what_cannot_run(
    flags: list[str], said: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The command line's refusals (``diffgemma_engine.service.runtime_choice``): exit 2, saying what to mend."""
    from diffgemma_engine.__main__ import main

    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(SystemExit) as exited:
        main(["serve", "--runtime", "vllm", "--socket", str(tmp_path / "e.sock"), *flags])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert said in err and "hunter2" not in err


def _misbehave(server: VllmServer, *modes: str) -> None:
    server.request("POST", "/standin/misbehave", {"modes": list(modes)})


def _until_aborted(log: Path, mode: str) -> dict:
    """The log's entry of the last request answered ``mode``, once the server has seen its client go."""
    deadline = time.monotonic() + 30
    while True:
        entries = [entry for entry in _requests(log) if entry.get("mode") == mode]
        if entries and entries[-1].get("aborted") is not None:
            return entries[-1]
        assert time.monotonic() < deadline, entries
        time.sleep(0.1)


def test_a_cancel_reaches_a_server_that_drips_its_reply(standin: tuple[VllmServer, Path], shipped: LoadedModel) -> None:
    """Issue 41: a server that sends its head and then a byte now and then held the model thread (the cancel was not
    looked at while the body came): the cancel is seen between bytes, and the connection closed aborts it."""
    server, log = standin
    _misbehave(server, "drip")
    body = completion_body(canvas_ask(shipped, _infill())[0], model="default", served_canvas=shipped.canvas_length)
    started = time.monotonic()

    def stop() -> str | None:
        return "cancelled" if time.monotonic() - started > 1.0 else None

    reply, stopped = server.complete(body, should_stop=stop)
    assert (reply, stopped) == (None, "cancelled")
    assert _until_aborted(log, "drip")["aborted"] is True  # the server saw its client go


def test_a_dripping_reply_has_an_overall_deadline(standin: tuple[VllmServer, Path], shipped: LoadedModel) -> None:
    server, log = standin
    _misbehave(server, "drip")
    body = completion_body(canvas_ask(shipped, _infill())[0], model="default", served_canvas=shipped.canvas_length)
    with pytest.raises(VllmError, match="did not finish its reply in time"):
        server.complete(body, timeout_s=2.0)
    assert _until_aborted(log, "drip")["aborted"] is True


def test_a_reply_larger_than_the_canvas_can_need_is_refused_at_once(
    standin: tuple[VllmServer, Path], shipped: LoadedModel
) -> None:
    """12 million token ids for a 32-token canvas were read and decoded whole (1.9 GB at its peak): the reply is
    refused once it passes what the request can need, and the server sees the client go before it has sent it."""
    server, log = standin
    _misbehave(server, "huge")
    body = completion_body(canvas_ask(shipped, _infill())[0], model="default", served_canvas=shipped.canvas_length)
    with pytest.raises(VllmError, match=f"over {reply_bound(body)} bytes, more than the request can need"):
        server.complete(body)
    assert reply_bound(body) < 1024 * 1024
    assert _until_aborted(log, "huge")["aborted"] is True


@pytest.mark.parametrize("mode", ["garbage", "shape", "huge_error"])
def test_a_refused_or_malformed_reply_is_one_line_saying_so(
    mode: str, standin: tuple[VllmServer, Path], shipped: LoadedModel
) -> None:
    """Such a reply came back as ``internal`` with a Python exception's name, or quoted whole (5 MB): it is vLLM's
    error (the worker's ``model_error``), one line, short, naming no Python class."""
    server, _ = standin
    _misbehave(server, mode)
    with pytest.raises(VllmError) as raised:
        run_on_vllm(shipped, _infill(), server, "default")
    message = str(raised.value)
    assert "\n" not in message and len(message) <= 400, message
    assert not any(name in message for name in ("Error:", "Exception", "JSONDecodeError", "TypeError")), message


async def test_a_dripping_reply_delays_no_other_document_past_its_deadline(
    standin: tuple[VllmServer, Path], short_tmp: Path
) -> None:
    """Issue 41: one document's request to a vLLM that drips its reply held the engine's model thread, and another
    document waited 102 s. The wait for the first ends at the second's deadline (a ``deadline`` stop, dropped in
    vLLM before the second is sent), and the second is answered."""
    server, log = standin
    assert server.socket_path is not None
    _misbehave(server, "drip")
    extra = ["--runtime", "vllm", "--vllm-socket", str(server.socket_path)]
    engine = EngineProcess(DEFAULT_MODEL_DIR, short_tmp / "engine.sock", short_tmp / "engine.log", extra)
    try:
        client = await RawClient.connect(engine.socket_path)
        arrived = _arrivals(log)
        await client.send(_infill(id="dripped", uri="file:///a.py"))
        await asyncio.to_thread(_until, lambda: _arrivals(log) > arrived)  # the first is with vLLM
        await client.send(_infill(id="other", uri="file:///b.py", deadline_ms=1500))
        replies = {}
        while len(replies) < 2:
            reply = await client.receive(timeout=120)
            assert isinstance(reply, protocol.Result), reply
            replies[reply.id] = reply
        assert replies["dripped"].stop is protocol.StopReason.DEADLINE and replies["dripped"].text == ""
        assert replies["other"].stop is protocol.StopReason.EOS, replies["other"]
        await client.close()
    finally:
        engine.stop()
    entries = [json.loads(line) for line in log.read_text().splitlines()]
    dropped = max(i for i, entry in enumerate(entries) if entry.get("mode") == "drip")
    assert entries[dropped]["aborted"] is True  # vLLM saw the first request's client go ...
    assert any(entry.get("arrived") for entry in entries[dropped:])  # ... before the second arrived


def _arrivals(log: Path) -> int:
    """Requests that reached the stand-in valid."""
    return sum(1 for line in log.read_text().splitlines() if '"arrived"' in line) if log.exists() else 0


def _until(condition: Callable[[], bool], timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline
        time.sleep(0.05)


def test_plain_http_elsewhere_is_the_users_explicit_choice() -> None:
    """Issue 41: ``--vllm-url http://other-host`` sent the key and the code in clear without a word; it is refused
    (above) unless ``--vllm-plain-http`` says so; loopback and https need nothing."""
    from diffgemma_engine.service.runtime_choice import Runtime, ServeOptions, choose_runtime

    def chosen(url: str, plain: bool = False) -> str:
        options = ServeOptions(runtime=Runtime.VLLM, engine_socket=Path("/tmp/e.sock"), vllm_url=url)
        return choose_runtime(attrs.evolve(options, vllm_plain_http=plain), lambda: 0).reason

    assert chosen("http://gpu-box:8000", plain=True) == "vLLM at http://gpu-box:8000 (attached)"
    assert chosen("https://gpu-box:8443") == "vLLM at https://gpu-box:8443 (attached)"
    assert chosen("http://127.0.0.1:8000") == "vLLM at http://127.0.0.1:8000 (attached)"


@pytest.fixture
def tcp_standin(vllm_python: Path, short_tmp: Path) -> Iterator[tuple[int, subprocess.Popen[bytes]]]:
    """The stand-in on 127.0.0.1 (``vllm serve --port``): its port and process."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    log = short_tmp / "requests.jsonl"
    command = [str(vllm_python), str(STANDIN), "--port", str(port), "--log", str(log), "--answer-ids", "5,6,1"]
    command += ["--model", str(DEFAULT_MODEL_DIR), "--canvas", "32"]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    yield port, process
    process.kill()
    process.wait()


async def test_a_url_with_a_password_and_a_key_never_reach_the_log(
    tcp_standin: tuple[int, subprocess.Popen[bytes]], short_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 41: a URL with a password was logged whole at INFO and the engine never became ready (the password
    went into the host). It serves (the password sent as HTTP basic auth, the key as a bearer token), and neither
    it nor the key is in the engine's log or its stats."""
    port, standin = tcp_standin
    monkeypatch.setenv("DIFFGEMMA_VLLM_API_KEY", "sk-never-logged-41")
    url = f"http://team:pw-never-logged@127.0.0.1:{port}"
    assert wait_until_healthy(VllmServer(url=url), 300, lambda: standin.poll() is None)
    extra = ["--runtime", "vllm", "--vllm-url", url]
    engine = EngineProcess(DEFAULT_MODEL_DIR, short_tmp / "engine.sock", short_tmp / "engine.log", extra)
    try:
        client = await RawClient.connect(engine.socket_path)
        await client.send(_infill(id="1"))
        result = await client.receive(timeout=120)
        assert isinstance(result, protocol.Result) and result.stop is protocol.StopReason.EOS, result
        await client.send(protocol.GetStats(id="stats"))
        stats = await client.receive()
        assert isinstance(stats, protocol.Stats)
        assert f"http://team:***@127.0.0.1:{port}" in stats.device and "pw-never-logged" not in stats.device
        await client.close()
    finally:
        engine.stop()
    text = engine.log()
    assert "canvases run by vLLM at http://team:***@" in text and "pw-never-logged" not in text
    assert "sk-never-logged-41" not in text


def test_each_request_to_vllm_carries_a_stable_session_key(
    standin: tuple[VllmServer, Path], shipped: LoadedModel
) -> None:
    """Issue 41: the engine's requests to vLLM carry ``x-session-id`` (this user's file, hashed), the same for each
    request of a file: a cache-aware router in front of a team's replicas keeps its prompt head on one."""
    server, log = standin
    for uri in ("file:///w/a.py", "file:///w/a.py", "file:///w/b.py"):
        run_on_vllm(shipped, _infill(uri=uri), server, "default")
    arrived = [json.loads(line) for line in log.read_text().splitlines() if '"arrived"' in line][-3:]
    first, again, other = (entry["session"] for entry in arrived)
    assert first == again == session_key("file:///w/a.py") != other == session_key("file:///w/b.py")
