"""A real ``diffgemma-engine serve`` process on a real socket: replies, cancel, supersede, bad input, security."""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import stat
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from diffgemma_engine.canvas.clock import MIN_STEP_SHARE
from diffgemma_engine.shared import frames, protocol
from tests.support.engine import EngineProcess, RawClient
from tests.support.models import MEMORIZED_MIDDLE, MEMORIZED_PREFIX, MEMORIZED_SUFFIX

ROOT = str(Path(__file__).resolve().parents[2])


@contextlib.contextmanager
def _engine(model_dir: Path, folder: Path) -> Iterator[EngineProcess]:
    """An engine on ``model_dir`` with its socket and log in ``folder``, stopped afterwards."""
    engine = EngineProcess(model_dir, folder / "run" / "engine.sock", folder / "engine.log")
    try:
        yield engine
    finally:
        engine.stop()


# One engine per model for the module (starting one costs about 5 s): its tests only talk to it, each over its own
# connection, and leave it serving; the one that opens the socket's permissions gets its own (``own_engine``).
@pytest.fixture(scope="module")
def memorized_engine(memorized_model_dir: Path, module_tmp: Path) -> Iterator[EngineProcess]:
    with _engine(memorized_model_dir, module_tmp / "memorized") as engine:
        yield engine


@pytest.fixture(scope="module")
def random_engine(random_model_dir: Path, module_tmp: Path) -> Iterator[EngineProcess]:
    with _engine(random_model_dir, module_tmp / "random") as engine:
        yield engine


@pytest.fixture
def own_engine(memorized_model_dir: Path, short_tmp: Path) -> Iterator[EngineProcess]:
    with _engine(memorized_model_dir, short_tmp) as engine:
        yield engine


@pytest.fixture
async def client(memorized_engine: EngineProcess) -> AsyncIterator[RawClient]:
    connection = await RawClient.connect(memorized_engine.socket_path)
    yield connection
    await connection.close()


def _infill(request_id: str, uri: str = "file:///a.py", **overrides: object) -> protocol.Infill:
    fields: dict[str, object] = dict(id=request_id, uri=uri, prefix=MEMORIZED_PREFIX, suffix=MEMORIZED_SUFFIX, seed=0)
    fields.update(overrides)
    return protocol.Infill(**fields)  # type: ignore[arg-type]


def test_the_socket_side_does_not_import_torch() -> None:
    code = (
        "import sys, diffgemma_engine.service.server; "
        "assert 'torch' not in sys.modules and 'transformers' not in sys.modules, "
        "'diffgemma_engine.service.server loads torch'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


async def test_infill_returns_the_multi_line_middle_with_timings(client: RawClient) -> None:
    await client.send(_infill("1"))
    result = await client.receive()
    assert isinstance(result, protocol.Result)
    assert result.id == "1"
    assert result.text == MEMORIZED_MIDDLE
    assert "\n" in result.text
    assert result.stop is protocol.StopReason.EOS
    assert 1 <= result.timings.steps < 16
    assert result.timings.new_tokens > 0
    assert result.timings.prompt_tokens > 0
    assert result.timings.denoise_ms > 0
    assert result.timings.tokenize_ms > 0
    own = result.timings
    assert own.total_ms == own.queue_ms + own.tokenize_ms + own.encode_ms + own.denoise_ms


async def test_next_keystroke_reuses_the_encoded_prefix(client: RawClient) -> None:
    await client.send(_infill("1"))
    first = await client.receive()
    await client.send(_infill("2", prefix=MEMORIZED_PREFIX + "    "))
    second = await client.receive()
    assert isinstance(first, protocol.Result) and isinstance(second, protocol.Result)
    assert first.timings.cached_tokens == 0
    assert 0 < second.timings.cached_tokens < second.timings.prompt_tokens


async def test_socket_is_private(memorized_engine: EngineProcess, client: RawClient) -> None:
    socket_mode = stat.S_IMODE(memorized_engine.socket_path.stat().st_mode)
    dir_mode = stat.S_IMODE(memorized_engine.socket_path.parent.stat().st_mode)
    assert socket_mode == 0o600
    assert dir_mode == 0o700


@pytest.mark.skipif(os.geteuid() != 0, reason="dropping to another uid needs root")
def test_peer_with_another_uid_is_refused(own_engine: EngineProcess) -> None:
    """A child that drops to uid 65534 reaches the socket (permissions opened for the test) and is refused."""
    path = own_engine.socket_path
    opened = [path.parent.parent, path.parent]
    for directory in opened:
        os.chmod(directory, 0o711)
    os.chmod(path, 0o666)
    script = f"""
import os, socket, struct, json
os.setgid(65534); os.setuid(65534)
s = socket.socket(socket.AF_UNIX); s.connect({str(path)!r})
body = json.dumps({{"type": "hello", "protocol": {protocol.PROTOCOL_VERSION}}}).encode()
try:
    s.sendall(struct.pack(">I", len(body)) + body)
except BrokenPipeError:  # refused before the hello arrived; the refusal is still there to read
    pass
n = struct.unpack(">I", s.recv(4))[0]; data = b""
while len(data) < n: data += s.recv(n - len(data))
print(data.decode())
try:
    rest = s.recv(1)
except ConnectionResetError:
    rest = b""
print("closed" if rest == b"" else "open")
"""
    try:
        out = subprocess.run(
            ["/usr/bin/env", "python3", "-I", "-c", script],
            capture_output=True,
            text=True,
            timeout=30,
            cwd="/",
        )
    finally:
        for directory in opened:
            os.chmod(directory, 0o700)
        os.chmod(path, 0o600)
    assert out.returncode == 0, out.stderr
    reply, state = out.stdout.strip().splitlines()
    assert json.loads(reply)["code"] == "permission_denied"
    assert state == "closed"


async def test_candidates_are_denoised_in_one_batch_and_come_back_distinct(random_engine: EngineProcess) -> None:
    client = await RawClient.connect(random_engine.socket_path)
    await client.send(_infill("three", seed=None, candidates=3))
    result = await client.receive()
    assert isinstance(result, protocol.Result)
    texts = [result.text, *result.alternatives]
    assert 2 <= len(texts) <= 3 and len(set(texts)) == len(texts), texts  # random weights: they differ
    assert all(texts)
    assert "(3 candidates" in random_engine.log()  # one batch: a decoder pass per step for all three
    await client.send(_infill("five", candidates=5))
    refused = await client.receive()
    assert isinstance(refused, protocol.Error) and "candidates" in refused.message
    await client.close()


async def test_identical_candidates_collapse_to_one(client: RawClient) -> None:
    await client.send(_infill("same", seed=None, candidates=3))
    result = await client.receive()
    assert isinstance(result, protocol.Result)
    assert result.text == MEMORIZED_MIDDLE and result.alternatives == []


async def test_cancel_mid_denoise_stops_within_a_step(random_engine: EngineProcess) -> None:
    """A cancel that comes while the canvas is being denoised stops it between two steps. On a loaded machine the
    first step may not have run when the cancel comes (it stops then too): the test waits longer each time, until
    one cancel lands mid-denoise."""
    client = await RawClient.connect(random_engine.socket_path)
    steps = []
    for attempt, wait_s in enumerate((0.5, 2.0, 6.0)):
        await client.send(_infill(f"slow-{attempt}", max_steps=200))
        await asyncio.sleep(wait_s)  # let a few steps run
        await client.send(protocol.Cancel(id=f"slow-{attempt}"))
        result = await client.receive()
        assert isinstance(result, protocol.Result) and result.id == f"slow-{attempt}"
        assert result.stop is protocol.StopReason.CANCELLED, result
        steps.append(result.timings.steps)
        assert result.timings.steps < 200, steps  # stopped, not run to its end
        if result.timings.steps > 0:
            break
    assert steps[-1] > 0, f"no cancel landed mid-denoise: {steps}"
    await client.close()


async def test_a_cancel_right_behind_its_request_stops_it(random_engine: EngineProcess) -> None:
    """Both frames in one write, as a cancel soon after a request reaches an engine that was busy or held: before,
    the ``Cancel`` was read before the ``Infill``'s job was queued, found nothing, and the request ran to its end."""
    client = await RawClient.connect(random_engine.socket_path)
    request = _infill("cancelled-at-once", max_steps=200)
    await client.send_raw(frames.encode(request) + frames.encode(protocol.Cancel(id=request.id)))
    result = await client.receive()
    assert isinstance(result, protocol.Result) and result.id == request.id
    assert result.stop is protocol.StopReason.CANCELLED, result
    await client.close()


async def test_newer_request_for_the_same_document_supersedes(random_engine: EngineProcess) -> None:
    client = await RawClient.connect(random_engine.socket_path)
    await client.send(_infill("old", max_steps=200))
    await asyncio.sleep(0.3)
    await client.send(_infill("new", max_steps=2))
    await client.send(_infill("other-doc", uri="file:///b.py", max_steps=2))
    replies = {(reply := await client.receive()).id: reply for _ in range(3)}
    assert replies["old"].stop is protocol.StopReason.SUPERSEDED
    assert replies["old"].timings.steps < 200
    assert replies["new"].stop in (protocol.StopReason.LENGTH, protocol.StopReason.EOS)
    assert replies["other-doc"].stop in (protocol.StopReason.LENGTH, protocol.StopReason.EOS)
    await client.close()


async def test_deadline_becomes_a_step_budget(random_engine: EngineProcess) -> None:
    """A deadline caps the steps (a whole, shorter schedule); one that cannot afford even the model's floor
    (``diffgemma_engine.canvas.clock``: half its schedule by default) runs the floor, later rather than worse."""
    client = await RawClient.connect(random_engine.socket_path)
    await client.send(_infill("warm", max_steps=20))  # the step clock's first estimates
    warm = await client.receive()
    assert isinstance(warm, protocol.Result)
    step_ms = warm.timings.denoise_ms / warm.timings.steps
    deadline_ms = max(50, round(50 * step_ms))  # about 50 steps' worth on this machine, whatever its speed
    started = time.monotonic()
    await client.send(_infill("budget", max_steps=200, deadline_ms=deadline_ms))
    result = await client.receive()
    elapsed = time.monotonic() - started
    assert result.stop in (protocol.StopReason.LENGTH, protocol.StopReason.DEADLINE)
    # About 50 steps fit the deadline, fewer than the 200-step schedule's floor: the floor runs, not 200 steps. The
    # schedule is planned from the step clock's estimates, so this holds on a loaded machine too, where a wall-clock
    # bound did not (a step took 10x its estimate beside two other test runs).
    assert result.timings.steps <= math.ceil(200 * MIN_STEP_SHARE) + 1, (result.timings, step_ms)
    assert elapsed < deadline_ms / 1000 + 30, elapsed  # no hang; how fast is the benchmarks' business
    await client.send(_infill("late", max_steps=200, deadline_ms=1))
    late = await client.receive()
    floor = 200 * MIN_STEP_SHARE  # a 200-step schedule's share, whatever the model's own step count
    assert math.floor(floor) <= late.timings.steps <= math.ceil(floor) + 1, late.timings
    await client.close()


BAD_FRAMES = {
    "not json": b"{nope",
    "invalid utf-8": b'{"type": "infill", "id": "\xff\xfe"}',
    "not an object": b"[1, 2, 3]",
    "unknown type": b'{"type": "explode", "id": "x"}',
    "missing field": b'{"type": "infill", "id": "x"}',
    "wrong type": b'{"type": "infill", "id": "x", "uri": 5, "prefix": "a"}',
}


@pytest.mark.parametrize("name", list(BAD_FRAMES))
async def test_bad_frame_gets_a_clear_error_and_the_connection_keeps_serving(client: RawClient, name: str) -> None:
    body = BAD_FRAMES[name]
    await client.send_raw(frames.HEADER.pack(len(body)) + body)
    error = await client.receive()
    assert isinstance(error, protocol.Error)
    assert error.code in (protocol.ErrorCode.BAD_REQUEST, protocol.ErrorCode.UNKNOWN_TYPE)
    assert error.message
    await client.send(_infill("after"))
    result = await client.receive()
    assert isinstance(result, protocol.Result) and result.text == MEMORIZED_MIDDLE


async def test_oversized_frame_is_refused_and_skipped(client: RawClient) -> None:
    size = frames.MAX_FRAME_BYTES + 1
    await client.send_raw(frames.HEADER.pack(size) + b"x" * size)
    error = await client.receive()
    assert isinstance(error, protocol.Error) and error.code is protocol.ErrorCode.TOO_LARGE
    await client.send(_infill("after"))
    assert (await client.receive()).text == MEMORIZED_MIDDLE


async def test_bad_values_are_refused_per_request(client: RawClient) -> None:
    await client.send(_infill("big-canvas", canvas_length=100_000))
    error = await client.receive()
    assert isinstance(error, protocol.Error) and error.id == "big-canvas"
    assert error.code is protocol.ErrorCode.BAD_REQUEST and "canvas_length" in error.message


async def test_handshake_rules(memorized_engine: EngineProcess) -> None:
    wrong_version = await RawClient.connect(memorized_engine.socket_path, hello=False)
    await wrong_version.send(protocol.Hello(protocol=999))
    error = await wrong_version.receive()
    assert isinstance(error, protocol.Error) and error.code is protocol.ErrorCode.VERSION_MISMATCH
    await wrong_version.close()

    no_hello = await RawClient.connect(memorized_engine.socket_path, hello=False)
    await no_hello.send(_infill("too-early"))
    error = await no_hello.receive()
    assert isinstance(error, protocol.Error) and "hello" in error.message
    await no_hello.close()

    # The engine is still serving.
    fine = await RawClient.connect(memorized_engine.socket_path)
    await fine.send(_infill("ok"))
    assert (await fine.receive()).text == MEMORIZED_MIDDLE
    await fine.close()


async def test_many_requests_each_get_exactly_one_reply(random_engine: EngineProcess) -> None:
    client = await RawClient.connect(random_engine.socket_path)
    ids = [f"r{i}" for i in range(20)]
    for index, request_id in enumerate(ids):
        await client.send(_infill(request_id, uri=f"file:///{index % 4}.py", max_steps=3))
        if index % 5 == 0:
            await client.send(protocol.Cancel(id=request_id))
    replies = [await client.receive() for _ in ids]
    assert sorted(reply.id for reply in replies) == sorted(ids)
    with pytest.raises(asyncio.TimeoutError):
        await client.receive(timeout=0.5)
    await client.close()


def test_second_engine_on_the_same_socket_exits(memorized_engine: EngineProcess, memorized_model_dir: Path) -> None:
    command = [
        sys.executable,
        "-m",
        "diffgemma_engine",
        "serve",
        "--model",
        str(memorized_model_dir),
        "--socket",
        str(memorized_engine.socket_path),
    ]
    assert subprocess.run(command, capture_output=True, timeout=60).returncode == 3
    assert subprocess.run([*command, "--exist-ok"], capture_output=True, timeout=60).returncode == 0
    assert memorized_engine.process.poll() is None


async def test_make_serve_while_an_engine_serves_ends_cleanly_saying_so(
    isolated_env: Path, memorized_model_dir: Path
) -> None:
    """``make serve`` (the Quick start) with an engine on the default socket: the engine says so and make ends with
    status 0, not with make's "Error 3" under the message."""
    from diffgemma_engine.shared.socket_paths import default_socket_path

    engine = EngineProcess(memorized_model_dir, default_socket_path(), isolated_env / "engine.log")
    try:
        await (await RawClient.connect(engine.socket_path)).close()
        bin_dir = os.path.dirname(sys.executable)
        served = await asyncio.to_thread(
            subprocess.run,
            ["make", "-s", "-C", ROOT, "serve", f"VENV={os.path.dirname(bin_dir)}", "-o", f"{bin_dir}/diffgemma-lsp"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert served.returncode == 0, served.stdout + served.stderr
        assert "Error" not in served.stderr and "says what it serves; stop it to start another here" in served.stderr, (
            served.stderr
        )
        assert engine.process.poll() is None
    finally:
        engine.stop()


def test_infill_cli_prints_the_middle(memorized_model_dir: Path, short_tmp: Path) -> None:
    (short_tmp / "suffix.txt").write_text(MEMORIZED_SUFFIX)
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "diffgemma_engine",
            "infill",
            "--model",
            str(memorized_model_dir),
            "--suffix",
            str(short_tmp / "suffix.txt"),
        ],
        input=MEMORIZED_PREFIX,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert out.stdout == MEMORIZED_MIDDLE + "\n"


def test_shipped_default_model_serves_without_any_option(short_tmp: Path) -> None:
    """`diffgemma-engine infill` with no --model loads the checkpoint inside the package and prints a middle."""
    out = subprocess.run(
        [sys.executable, "-m", "diffgemma_engine", "infill"],
        input="def is_even(n):\n",
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert out.stdout.endswith("\n")
    assert "loaded default" in out.stderr and "stop=" in out.stderr
