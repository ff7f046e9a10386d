"""Issue 27 end to end: the real language server, the real engine with ``serve --runtime vllm --vllm-socket S``, and
on S the one stand-in (tests/support/vllm_standin.py: vLLM 0.33's own request parsing, validation and response
classes, for vLLM's GPU execution, which cannot run here). A completion, an inline completion with candidates, a
rewrite and a cancel go through it, and every request the engine sent passed vLLM's own checks."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from lsprotocol import types
from pytest_lsp import LanguageClient
from transformers import AutoTokenizer

from diffgemma_engine.loading.checkpoint_files import DEFAULT_MODEL_DIR
from diffgemma_engine.vllm.client import VllmServer, wait_until_healthy
from tests.support.engine import EngineProcess
from tests.support.lsp import (
    Editor,
    RawLsp,
    complete,
    inline_complete,
    rewrite,
    server_command,
    span,
    start_client,
)

pytestmark = pytest.mark.e2e
STANDIN = Path(__file__).resolve().parents[1] / "support" / "vllm_standin.py"
URI = "file:///work/add.py"
ANSWER = "a + b"
"""What the stand-in's canvas holds (the shipped tokenizer's ids of it, then end-of-sequence)."""


@pytest.fixture(scope="module")
def vllm_socket(vllm_python: Path) -> Iterator[tuple[VllmServer, Path]]:
    """The stand-in on a Unix socket in a private directory, answering ``ANSWER`` to every request."""
    tokenizer = AutoTokenizer.from_pretrained(DEFAULT_MODEL_DIR, local_files_only=True)
    config = json.loads((DEFAULT_MODEL_DIR / "config.json").read_text())
    canvas = config["canvas_length"]
    ids = [*tokenizer.encode(ANSWER, add_special_tokens=False), tokenizer.eos_token_id]
    folder = Path(tempfile.mkdtemp(prefix="vllm-", dir="/tmp"))
    os.chmod(folder, 0o700)
    log = folder / "requests.jsonl"
    command = [str(vllm_python), str(STANDIN), "--socket", str(folder / "vllm.sock"), "--log", str(log)]
    command += ["--model", str(DEFAULT_MODEL_DIR), "--canvas", str(canvas), "--no-seed-echo"]
    command += ["--answer-ids", ",".join(map(str, ids))]
    process = subprocess.Popen(command, stderr=subprocess.PIPE, text=True)
    server = VllmServer(socket_path=folder / "vllm.sock")
    assert wait_until_healthy(server, 300, lambda: process.poll() is None), process.stderr and process.stderr.read()
    yield server, log
    process.kill()
    process.wait()


@pytest.fixture
async def lsp(
    vllm_socket: tuple[VllmServer, Path], isolated_env: Path
) -> AsyncIterator[tuple[LanguageClient, Editor, EngineProcess]]:
    server, _ = vllm_socket
    socket_path = isolated_env / "run" / "engine.sock"
    socket_path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    assert server.socket_path is not None
    extra = ["--runtime", "vllm", "--vllm-socket", str(server.socket_path)]
    engine = EngineProcess(DEFAULT_MODEL_DIR, socket_path, isolated_env / "engine.log", extra)
    client = await start_client(
        server_command(socket_path, None), init_options={"diffgemma": {"debounceMs": 0, "extraContextTokens": 0}}
    )
    try:
        yield client, Editor(client), engine
    finally:
        await client.shutdown_session()
        engine.stop()


def _requests(log: Path) -> list[dict]:
    """The requests the stand-in answered, refused or dropped (not the notes of their arrival)."""
    if not log.exists():
        return []
    return [entry for line in log.read_text().splitlines() if "ok" in (entry := json.loads(line))]


def _aborted(log: Path) -> int:
    return sum(1 for entry in _requests(log) if entry.get("aborted"))


def _arrivals(log: Path) -> int:
    return sum(1 for line in log.read_text().splitlines() if "arrived" in json.loads(line)) if log.exists() else 0


async def _status(client: LanguageClient) -> dict:
    result = await client.workspace_execute_command_async(types.ExecuteCommandParams(command="diffgemma.status"))
    assert isinstance(result, dict)
    return result


async def _until_ready(client: LanguageClient) -> None:
    deadline = asyncio.get_running_loop().time() + 120
    while (await _status(client))["engine"] != "ready":
        assert asyncio.get_running_loop().time() < deadline, "the engine never became ready"
        await asyncio.sleep(0.25)


async def test_completions_and_a_rewrite_run_on_vllm(
    lsp: tuple[LanguageClient, Editor, EngineProcess], vllm_socket: tuple[VllmServer, Path]
) -> None:
    client, editor, engine = lsp
    _, log = vllm_socket
    before = len(_requests(log))
    editor.open(URI, "def add(a, b):\n    return \n")
    await _until_ready(client)
    result = await complete(client, URI, 1, 11)
    assert [item.text_edit.new_text for item in result.items if item.text_edit] == [ANSWER], engine.log()[-2000:]
    inline = await inline_complete(client, URI, 1, 11)
    assert [item.insert_text for item in inline.items] == [ANSWER]  # three candidates, one distinct answer
    editor.change(URI, types.TextDocumentContentChangePartial(range=span(1, 11, 1, 11), text="a - b"))
    outcome = await rewrite(client, URI, span(1, 11, 1, 16), 2)
    assert outcome == {"applied": True, "reason": ""}, outcome
    assert editor.text(URI) == "def add(a, b):\n    return a + b\n"
    sent = _requests(log)[before:]
    assert len(sent) == 3 and all(entry["ok"] for entry in sent), sent  # vLLM's own checks passed each
    assert [entry["body"]["n"] for entry in sent] == [1, 3, 1]
    assert "diffusion_seed_canvas" in sent[2]["extra_args"]  # the rewrite started from the selection
    assert f"canvases run by vllm 0.33.0 at {vllm_socket[0].socket_path}" in engine.log()
    assert "tokenizer, config and schedule, no weights" in engine.log()  # the weights are vLLM's alone
    command = [sys.executable, "-m", "diffgemma_lsp", "doctor", "--engine-socket", str(engine.socket_path), "--json"]
    doctor = await asyncio.create_subprocess_exec(*command, stdout=asyncio.subprocess.PIPE)
    out, _ = await asyncio.wait_for(doctor.communicate(), 120)
    assert json.loads(out)["device"].startswith("vllm 0.33.0 at "), out  # the runtime, as doctor shows it


async def test_a_cancelled_completion_is_aborted_in_vllm(
    lsp: tuple[LanguageClient, Editor, EngineProcess], vllm_socket: tuple[VllmServer, Path]
) -> None:
    """``$/cancelRequest`` from the editor (a second window's language server, on the same engine) closes the
    engine's connection to vLLM, which drops the request."""
    _, _, engine = lsp
    server, log = vllm_socket
    raw = await RawLsp.start(server_command(engine.socket_path, None))
    server.request("POST", "/standin/delay", {"delay_s": 60})
    try:
        await raw.initialize({"debounceMs": 0, "extraContextTokens": 0})
        raw.notify(
            "textDocument/didOpen",
            {
                "textDocument": {
                    "uri": URI,
                    "languageId": "python",
                    "version": 1,
                    "text": "def add(a, b):\n    return \n",
                }
            },
        )
        aborted, arrived = _aborted(log), _arrivals(log)
        params = {"textDocument": {"uri": URI}, "position": {"line": 1, "character": 11}, "context": {"triggerKind": 1}}
        deadline = asyncio.get_running_loop().time() + 60
        for attempt in range(100, 400):  # until one reaches vLLM (the first may come while the server connects)
            raw.request(attempt, "textDocument/completion", params)
            while _arrivals(log) == arrived and asyncio.get_running_loop().time() < deadline:
                await asyncio.sleep(0.1)
                if raw.responses.get(attempt):
                    break
            if _arrivals(log) > arrived:
                break
        else:
            raise AssertionError("no completion reached vLLM")
        raw.notify("$/cancelRequest", {"id": attempt})
        reply = await raw.reply(attempt, timeout=30)
        assert reply.get("error", {}).get("code") == -32800 or reply.get("result", {}).get("items") == [], reply
        while _aborted(log) == aborted:
            assert asyncio.get_running_loop().time() < deadline + 30, "vLLM never saw the request dropped"
            await asyncio.sleep(0.1)
    finally:
        server.request("POST", "/standin/delay", {"delay_s": 0})
        await raw.stop()


def _processes_under(folder: Path, marker: str) -> list[int]:
    """The pids of this user's processes whose command line names ``folder`` and ``marker``."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if entry.name.isdigit() and str(folder) in command and marker in command:
            found.append(int(entry.name))
    return found


async def test_the_editor_settings_start_an_engine_that_runs_its_own_vllm(
    vllm_python: Path, isolated_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``runtime: vllm`` and ``vllmCommand`` in the editor's settings: the language server starts an engine with
    ``--runtime vllm --vllm-command``, which starts ``vllm serve`` (the stand-in, reading its command line with
    vLLM's own parser) and serves the completion through it."""
    executable = isolated_env / "bin" / "vllm"
    executable.parent.mkdir()
    executable.write_text(f'#!/bin/sh\nexec "{vllm_python}" "{STANDIN}" "$@"\n')
    executable.chmod(0o755)
    log = isolated_env / "vllm.jsonl"
    tokenizer = AutoTokenizer.from_pretrained(DEFAULT_MODEL_DIR, local_files_only=True)
    ids = [*tokenizer.encode(ANSWER, add_special_tokens=False), tokenizer.eos_token_id]
    monkeypatch.setenv("DIFFGEMMA_STANDIN_LOG", str(log))
    monkeypatch.setenv("DIFFGEMMA_STANDIN_ANSWER_IDS", ",".join(map(str, ids)))
    settings = {"debounceMs": 0, "extraContextTokens": 0, "runtime": "vllm", "vllmCommand": str(executable)}
    client = await start_client([sys.executable, "-m", "diffgemma_lsp", "--stdio"], init_options=settings)
    try:
        editor = Editor(client)
        editor.open(URI, "def add(a, b):\n    return \n")
        await _until_ready(client)
        result = await complete(client, URI, 1, 11)
        assert [item.text_edit.new_text for item in result.items if item.text_edit] == [ANSWER]
        served = [json.loads(line) for line in log.read_text().splitlines() if '"served"' in line]
        assert [entry["served"]["model"] for entry in served] == [str(DEFAULT_MODEL_DIR)]
        sent = _requests(log)
        assert len(sent) == 1 and sent[0]["ok"], sent  # vLLM's own checks passed it
    finally:
        await client.shutdown_session()
        engines = _processes_under(isolated_env, "diffgemma_engine")
        for pid in engines:  # the engine outlives the editor (it serves every window): stopped here
            os.kill(pid, 15)
        deadline = asyncio.get_running_loop().time() + 30
        while _processes_under(isolated_env, "vllm_standin") or _processes_under(isolated_env, "diffgemma_engine"):
            assert asyncio.get_running_loop().time() < deadline, "the engine or its vLLM did not stop"
            await asyncio.sleep(0.2)
    assert engines, "no engine was started"
