"""Issue 27: ``diffgemma-engine serve --runtime vllm --vllm-command VLLM`` runs its own vLLM: it starts
``vllm serve`` on a socket beside its own, waits while it loads, reports and restarts it when it dies, gives up
with its words when it cannot start, and stops it with the engine, even when the engine is killed.

``VLLM`` here runs tests/support/vllm_standin.py, which reads the command line with vLLM 0.33's own ``vllm serve``
parser and each request with vLLM's own request code (the one stand-in: for vLLM's GPU execution)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from diffgemma_engine.loading.checkpoint_files import DEFAULT_MODEL_DIR
from diffgemma_engine.loading.model import load_facts
from diffgemma_engine.shared import protocol
from diffgemma_engine.shared.socket_paths import UnsafeSocketError
from diffgemma_engine.vllm.client import VllmError, VllmServer
from diffgemma_engine.vllm.completions import CACHED_UNREPORTED, STEPS_UNREPORTED
from diffgemma_engine.vllm.process import clear_stale_socket
from tests.support.engine import EngineProcess, RawClient

STANDIN = Path(__file__).resolve().parents[1] / "support" / "vllm_standin.py"


@pytest.fixture
def fake_vllm(vllm_python: Path, short_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Path, Path]]:
    """A ``vllm`` executable that runs the stand-in, and the log of what it was started with and asked."""
    executable = short_tmp / "bin" / "vllm"
    executable.parent.mkdir()
    executable.write_text(f'#!/bin/sh\nexec "{vllm_python}" "{STANDIN}" "$@"\n')
    executable.chmod(0o755)
    log = short_tmp / "vllm.jsonl"
    monkeypatch.setenv("DIFFGEMMA_STANDIN_LOG", str(log))
    monkeypatch.setenv("DIFFGEMMA_STANDIN_ANSWER_IDS", "5,6,1")
    yield executable, log
    for pid in _started(log):  # nothing left behind, whatever the test did
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)


def _started(log: Path) -> list[int]:
    lines = log.read_text().splitlines() if log.exists() else []
    return [entry["started"] for line in lines if "started" in (entry := json.loads(line))]


def _served(log: Path) -> list[dict]:
    return [entry["served"] for line in log.read_text().splitlines() if "served" in (entry := json.loads(line))]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie is gone too: its parent has not reaped it yet
    status = Path(f"/proc/{pid}/stat")
    return status.exists() and status.read_text().split(") ", 1)[1][0] != "Z"


def _until(condition: object, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


def _engine(short_tmp: Path, executable: Path) -> EngineProcess:
    extra = ["--runtime", "vllm", "--vllm-command", str(executable)]
    return EngineProcess(DEFAULT_MODEL_DIR, short_tmp / "engine.sock", short_tmp / "engine.log", extra)


async def _stats(client: RawClient) -> protocol.Stats:
    await client.send(protocol.GetStats(id="stats"))
    stats = await client.receive()
    assert isinstance(stats, protocol.Stats), stats
    return stats


async def _complete(client: RawClient, request_id: str) -> protocol.Result | protocol.Error:
    await client.send(protocol.Infill(id=request_id, uri="file:///a.py", prefix="def add(a, b):\n    ", seed=1))
    reply = await client.receive()
    assert isinstance(reply, protocol.Result | protocol.Error), reply
    return reply


async def test_the_engine_starts_its_vllm_waits_for_it_and_it_goes_with_the_engine(
    fake_vllm: tuple[Path, Path], short_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    executable, log = fake_vllm
    monkeypatch.setenv("DIFFGEMMA_STANDIN_START_DELAY_S", "2")  # loading: the engine waits, clients are told
    engine = _engine(short_tmp, executable)
    try:
        client = await RawClient.connect(engine.socket_path)
        stats = await _stats(client)
        vllm_socket = short_tmp / "engine.vllm.sock"
        assert stats.device == f"vllm 0.33.0 at {vllm_socket} (started by the engine: {executable})"
        assert stats.runtime_state == protocol.RUNTIME_HEALTHY
        facts = load_facts(DEFAULT_MODEL_DIR)
        (served,) = _served(log)  # read by vLLM's own parser: the recipe's options at the engine's canvas
        assert served == {
            "model": str(DEFAULT_MODEL_DIR),
            "uds": str(vllm_socket),
            "canvas_length": facts.canvas_length,
            "max_denoising_steps": facts.sampler.max_steps,
            "max_num_seqs": 4,
            "tensor_parallel_size": 1,
            "enable_prefix_caching": True,
            "enable_prompt_tokens_details": True,
            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        }
        result = await _complete(client, "1")
        assert isinstance(result, protocol.Result) and result.stop is protocol.StopReason.EOS, result
        assert "vllm: standin: loading" in engine.log()  # its output while it loads: the engine's progress
        command = [sys.executable, "-m", "diffgemma_lsp", "doctor", "--engine-socket", str(engine.socket_path)]
        doctor = await asyncio.create_subprocess_exec(*command, stdout=asyncio.subprocess.PIPE)
        report = (await asyncio.wait_for(doctor.communicate(), 120))[0].decode()
        assert doctor.returncode == 0, report
        assert f"device          vllm 0.33.0 at {vllm_socket} (started by the engine" in report
        assert "runtime state   healthy" in report
        assert "seeds           not reproducible: vLLM takes no seed" in report  # issue 41: it refuses one
        assert f"runtime note    {STEPS_UNREPORTED}" in report  # the steps vLLM ran are not known
        assert CACHED_UNREPORTED not in report  # the engine starts it with --enable-prompt-tokens-details
        (pid,) = _started(log)
        engine.process.send_signal(signal.SIGKILL)  # no chance to stop it: the kernel's death signal does
        engine.process.wait()
        _until(lambda: not _alive(pid), 15, "vLLM outlived the engine that was killed")
    finally:
        engine.stop()


async def test_a_vllm_that_dies_is_reported_once_and_restarted_and_stopped_with_the_engine(
    fake_vllm: tuple[Path, Path], short_tmp: Path
) -> None:
    executable, log = fake_vllm
    engine = _engine(short_tmp, executable)
    try:
        client = await RawClient.connect(engine.socket_path)
        VllmServer(socket_path=short_tmp / "engine.vllm.sock").request("POST", "/standin/exit", {})
        deadline = time.monotonic() + 30
        while not (stats := await _stats(client)).runtime_state.startswith("restarting"):
            assert time.monotonic() < deadline, stats
        assert "exit status 3" in stats.runtime_state and "illegal memory access" in stats.runtime_state
        refused = await _complete(client, "while-down")  # answered, saying why, not left waiting
        assert isinstance(refused, protocol.Error) and refused.code is protocol.ErrorCode.MODEL_ERROR, refused
        assert "vLLM is not serving" in refused.message and "exit status 3" in refused.message
        deadline = time.monotonic() + 90
        while (stats := await _stats(client)).runtime_state != protocol.RUNTIME_HEALTHY:
            assert time.monotonic() < deadline, stats
            await asyncio.sleep(0.2)
        first, second = _started(log)
        assert first != second and not _alive(first)
        result = await _complete(client, "after")
        assert isinstance(result, protocol.Result) and result.stop is protocol.StopReason.EOS, result
        assert engine.log().count("restarting it in 1 s (restart 1)") == 1
        await client.close()
        engine.stop()  # SIGTERM: the engine stops its vLLM on the way out
        assert engine.process.returncode == 0
        _until(lambda: not _alive(second), 5, "vLLM outlived the engine")
    finally:
        engine.stop()


async def test_a_vllm_that_cannot_start_fails_the_load_with_its_own_words(
    fake_vllm: tuple[Path, Path], short_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    executable, log = fake_vllm
    monkeypatch.setenv("DIFFGEMMA_STANDIN_REFUSE", "CUDA out of memory. Tried to allocate 20.00 GiB")
    engine = _engine(short_tmp, executable)
    try:
        client = await RawClient.connect(engine.socket_path, wait_ready=False)
        failed = await client.receive(timeout=120)
        assert isinstance(failed, protocol.Error), failed
        assert "vLLM did not start (exit status 1)" in failed.message
        assert "CUDA out of memory. Tried to allocate 20.00 GiB" in failed.message
        assert engine.process.wait(30) == 1
        assert len(_started(log)) == 1  # a start that fails is not retried: it would fail again
    finally:
        engine.stop()


async def test_a_second_start_and_a_restart_after_sigkill_clear_the_socket_vllm_left(
    fake_vllm: tuple[Path, Path], short_tmp: Path
) -> None:
    """Issue 41: vLLM binds ``--uds`` before it loads and never removes the file (the stand-in binds with vLLM's own
    ``create_server_unix_socket``), so the next ``vllm serve`` on it fails with "Address already in use". The engine
    clears it: a second engine on the same runtime folder is ready again, and a vLLM killed with SIGKILL is
    restarted and serves."""
    executable, log = fake_vllm
    vllm_socket = short_tmp / "engine.vllm.sock"
    engine = _engine(short_tmp, executable)
    try:
        client = await RawClient.connect(engine.socket_path)
        assert isinstance(await _complete(client, "first"), protocol.Result)
        await client.close()
    finally:
        engine.stop()
    assert engine.process.returncode == 0
    assert vllm_socket.is_socket()  # what vLLM leaves behind, even after a clean SIGTERM
    engine = _engine(short_tmp, executable)  # the second start, on the same runtime folder
    try:
        client = await RawClient.connect(engine.socket_path)
        result = await _complete(client, "second")
        assert isinstance(result, protocol.Result) and result.stop is protocol.StopReason.EOS, result
        killed = _started(log)[-1]
        os.kill(killed, signal.SIGKILL)
        deadline = time.monotonic() + 120
        while len(_started(log)) < 3 or (await _stats(client)).runtime_state != protocol.RUNTIME_HEALTHY:
            assert time.monotonic() < deadline, (await _stats(client), engine.log()[-2000:])
            await asyncio.sleep(0.2)
        result = await _complete(client, "after-sigkill")
        assert isinstance(result, protocol.Result) and result.stop is protocol.StopReason.EOS, result
        assert "Address already in use" not in engine.log()
        await client.close()
    finally:
        engine.stop()


def test_only_a_stale_socket_in_a_private_folder_is_removed(short_tmp: Path) -> None:
    """What ``clear_stale_socket`` leaves alone: a file that is not a socket, a socket something listens on, and
    anything in a folder others can write to; a socket nothing listens on is removed."""
    stale = short_tmp / "stale.sock"
    with socket.socket(socket.AF_UNIX) as left:
        left.bind(str(stale))  # bound and closed: a socket file nothing listens on, as vLLM leaves it
    clear_stale_socket(stale)
    assert not stale.exists()
    clear_stale_socket(stale)  # nothing there: nothing to do
    regular = short_tmp / "file.sock"
    regular.write_text("not a socket")
    with pytest.raises(VllmError, match="is not a socket"):
        clear_stale_socket(regular)
    assert regular.read_text() == "not a socket"
    with socket.socket(socket.AF_UNIX) as live:
        live.bind(str(stale))
        live.listen()
        with pytest.raises(VllmError, match="already listens"):
            clear_stale_socket(stale)
    assert stale.is_socket()
    shared = short_tmp / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with socket.socket(socket.AF_UNIX) as left:
        left.bind(str(shared / "vllm.sock"))
    with pytest.raises(UnsafeSocketError, match="can be written by others"):
        clear_stale_socket(shared / "vllm.sock")
    assert (shared / "vllm.sock").is_socket()
