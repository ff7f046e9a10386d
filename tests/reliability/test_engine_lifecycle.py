"""The engine's socket over its life: removed by a /tmp cleaner while the engine runs (it listens again, and
new clients get in), replaced by another engine's (it takes no new clients and leaves when its own have gone),
and signals that stop it (SIGHUP as SIGTERM: the socket is removed; clients connected at the time cost no
traceback)."""

from __future__ import annotations

import asyncio
import shutil
import signal
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from diffgemma_engine.service.socket_file import SOCKET_CHECK_S
from diffgemma_engine.shared import protocol
from tests.support.engine import EngineProcess, RawClient
from tests.support.models import MEMORIZED_MIDDLE, MEMORIZED_PREFIX, MEMORIZED_SUFFIX

pytestmark = pytest.mark.e2e
SLACK_S = 10.0


@pytest.fixture
def engine(memorized_model_dir: Path, short_tmp: Path) -> Iterator[EngineProcess]:
    process = EngineProcess(memorized_model_dir, short_tmp / "run" / "engine.sock", short_tmp / "engine.log")
    yield process
    process.stop()


async def _served(client: RawClient, request_id: str) -> bool:
    await client.send(
        protocol.Infill(id=request_id, uri="file:///a.py", prefix=MEMORIZED_PREFIX, suffix=MEMORIZED_SUFFIX, seed=0)
    )
    reply = await client.receive()
    return isinstance(reply, protocol.Result) and reply.text == MEMORIZED_MIDDLE


async def _connect_within(path: Path, seconds: float) -> tuple[RawClient, float]:
    started = time.monotonic()
    while True:
        try:
            return await RawClient.connect(path), time.monotonic() - started
        except (FileNotFoundError, ConnectionRefusedError):
            if time.monotonic() - started > seconds:
                raise
            await asyncio.sleep(0.1)


@pytest.mark.parametrize("removed", ["socket file", "socket directory"])
async def test_a_removed_socket_is_listened_on_again(engine: EngineProcess, removed: str) -> None:
    old_client = await RawClient.connect(engine.socket_path)
    if removed == "socket file":
        engine.socket_path.unlink()
    else:  # the socket and its lock file, as a cleaner of old files in /tmp would
        shutil.rmtree(engine.socket_path.parent)
    new_client, took = await _connect_within(engine.socket_path, SOCKET_CHECK_S + SLACK_S)
    print(f"engine lifecycle: {removed} removed; a new client got in after {took:.1f} s")
    try:
        assert await _served(new_client, "new")
        assert await _served(old_client, "old")  # the connection made before is still served
        assert (engine.socket_path.parent / "engine.sock.lock").exists()
    finally:
        await new_client.close()
        await old_client.close()
    assert engine.process.poll() is None
    assert "was removed: listening on it again" in engine.log()


async def test_a_socket_taken_by_another_process_makes_the_engine_leave_with_its_clients(
    engine: EngineProcess,
) -> None:
    client = await RawClient.connect(engine.socket_path)
    engine.socket_path.unlink()
    other = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    other.bind(str(engine.socket_path))  # someone else's now, before the engine looks again
    (engine.socket_path.parent / "engine.sock.lock").unlink()
    try:
        await asyncio.sleep(SOCKET_CHECK_S + 1)
        assert await _served(client, "still")  # its own client keeps being served
        assert engine.process.poll() is None
        await client.close()
        engine.process.wait(timeout=SOCKET_CHECK_S + SLACK_S)
        assert engine.process.returncode == 0
        assert engine.socket_path.exists()  # not removed: it is not the engine's any more
    finally:
        other.close()
    assert "taking no new clients" in engine.log()


@pytest.mark.parametrize("signum", [signal.SIGHUP, signal.SIGTERM], ids=["SIGHUP", "SIGTERM"])
async def test_a_stop_signal_with_clients_connected_exits_cleanly(engine: EngineProcess, signum: int) -> None:
    ready = await RawClient.connect(engine.socket_path)
    _, silent = await asyncio.open_unix_connection(str(engine.socket_path))  # never says hello
    await asyncio.sleep(0.2)
    engine.process.send_signal(signum)
    engine.process.wait(timeout=30)
    silent.close()
    await ready.close()
    log = engine.log()
    print(f"engine lifecycle: {signal.Signals(signum).name} with 2 clients -> exit {engine.process.returncode}")
    assert engine.process.returncode == 0
    assert not engine.socket_path.exists()
    assert "Traceback" not in log, log[-3000:]


async def test_an_engine_whose_socket_folder_was_removed_leaves_and_does_not_make_it_again(
    memorized_model_dir: Path, short_tmp: Path
) -> None:
    """The folder above the socket's directory removed (a test's temporary folder, the runtime directory at logout):
    no client looks there any more, so the engine leaves once its clients have; it made the whole tree again and
    stayed (an engine that ``make test`` left behind, in a temporary folder it had re-created)."""
    engine = EngineProcess(
        memorized_model_dir, short_tmp / "gone" / "run" / "engine.sock", short_tmp / "engine.log", ["--idle-exit", "0"]
    )
    try:
        client = await RawClient.connect(engine.socket_path)
        shutil.rmtree(short_tmp / "gone")
        await asyncio.sleep(SOCKET_CHECK_S + 1)
        assert await _served(client, "connected")  # a client connected before is still served
        await client.close()
        assert engine.process.wait(timeout=SOCKET_CHECK_S * 10) == 0
        assert not (short_tmp / "gone").exists()
        assert "cannot be taken again" in engine.log()
    finally:
        engine.stop()
