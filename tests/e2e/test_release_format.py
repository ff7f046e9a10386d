"""The released DiffusionGemma-IT's path, on checkpoints in its on-disk format: the real engine process and the
real language server, its chat template, Gemma 4 control tokens, sharded bf16 weights and generation config."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import attrs
import pytest
from lsprotocol import types
from pytest_lsp import LanguageClient

from diffgemma_engine.shared import protocol
from diffgemma_engine.shared.prompt import CHAT_INSTRUCTION_SUFFIX_FIRST, CURSOR_MARK
from tests.e2e.test_lsp_engine import lsp_session
from tests.support.engine import EngineProcess, RawClient
from tests.support.lsp import (
    attached_client,
    complete,
    complete_when_ready,
    inline_complete,
    open_document,
    until_ready,
)
from tests.support.lsp import status as status_of  # beside the tests' own `status` variables
from tests.support.release_format import ANSWERED_PREFIX, ANSWERED_SUFFIX, INSERTED

pytestmark = pytest.mark.e2e
URI = "file:///work/example.py"
CURSOR = (1, 0)  # the empty line under "def add(a, b):"
INSTRUCTION = CHAT_INSTRUCTION_SUFFIX_FIRST.format(mark=CURSOR_MARK)


def long_source(lines: int = 1500) -> str:
    return "".join(f"def helper_{i}(value):\n    return value * {i}\n\n" for i in range(lines))


def doctor(socket_path: Path, *extra: str) -> tuple[int, dict[str, object]]:
    done = subprocess.run(
        [sys.executable, "-m", "diffgemma_lsp", "doctor", "--engine-socket", str(socket_path), "--json", *extra],
        capture_output=True,
        text=True,
        timeout=180,
    )
    return done.returncode, json.loads(done.stdout)


@pytest.fixture(scope="module")
def engine(module_tmp: Path, release_random_dir: Path) -> Iterator[EngineProcess]:
    """One engine on the random release-format checkpoint for the module's tests that talk to it."""
    process = EngineProcess(release_random_dir, module_tmp / "engine.sock", module_tmp / "engine.log")
    yield process
    process.stop()


async def test_the_engine_serves_the_release_format_and_doctor_probes_it(engine: EngineProcess) -> None:
    client = await RawClient.connect(engine.socket_path)
    await client.close()
    status, report = doctor(engine.socket_path, "--probe")
    assert status == 0, report
    assert report["ready"] is True and report["layout"] == "chat"
    assert report["probe"]["prompt_tokens"] > 0 and report["probe"]["steps"] == 48  # the release's step count
    assert "layout chat" in engine.log() and "canvas 256" in engine.log()


async def test_a_60000_character_prefix_gets_a_prompt_with_bos_and_the_instruction(engine: EngineProcess) -> None:
    prefix = long_source() + ANSWERED_PREFIX
    assert len(prefix) >= 60_000
    client = await RawClient.connect(engine.socket_path)
    try:
        request = protocol.Infill(
            id="long", uri="file:///long.py", prefix=prefix, suffix=long_source(200), language_id="python", echo=True
        )
        await client.send(attrs.evolve(request, max_steps=2))
        result = await client.receive()
        assert isinstance(result, protocol.Result), result
        assert result.prompt.startswith("<bos><|turn>user\n")
        assert INSTRUCTION in result.prompt
        assert result.prompt.endswith(
            f"{ANSWERED_PREFIX}{CURSOR_MARK}\n```<turn|>\n<|turn>model\n<|channel>thought\n<channel|>"
        )
        assert 0 < result.timings.prompt_tokens <= 1024
        # The next keystroke reuses the prompt's encoding up to the cursor.
        typed = attrs.evolve(request, id="typed", prefix=prefix + "    r", echo=False, max_steps=2)
        await client.send(typed)
        again = await client.receive()
        assert isinstance(again, protocol.Result)
        assert again.timings.cached_tokens >= 0.9 * again.timings.prompt_tokens
    finally:
        await client.close()


async def test_cancel_stops_a_release_format_canvas(engine: EngineProcess) -> None:
    client = await RawClient.connect(engine.socket_path)
    try:
        # the same prompt once, one step: encoded now, so the slow one below spends its time denoising and the
        # cancel lands between steps however long an encoding takes on a loaded machine
        await client.send(protocol.Infill(id="warm", uri="file:///a.py", prefix="def f():\n", max_steps=1))
        assert isinstance(await client.receive(), protocol.Result)
        await client.send(protocol.Infill(id="slow", uri="file:///a.py", prefix="def f():\n", max_steps=200))
        await asyncio.sleep(0.5)
        await client.send(protocol.Cancel(id="slow"))
        result = await client.receive()
        assert isinstance(result, protocol.Result) and result.stop is protocol.StopReason.CANCELLED
        assert result.timings.steps < 200  # stopped; before its first step when encoding outlasted the 0.5 s
    finally:
        await client.close()


async def test_doctor_reports_a_failed_load_with_its_reason(short_tmp: Path, release_random_dir: Path) -> None:
    broken = short_tmp / "broken"
    shutil.copytree(release_random_dir, broken)
    (broken / "chat_template.jinja").unlink()  # no FIM tokens and no chat template: no way to lay out a prompt
    process = EngineProcess(broken, short_tmp / "engine.sock", short_tmp / "engine.log")
    try:
        status, report = doctor(process.socket_path, "--model", str(broken))
        assert status == 1, report
        assert "model failed to load" in str(report["problem"]) and "chat template" in str(report["problem"])
        plan = report["plan"]  # the memory plan of the model that failed, from its config alone
        assert isinstance(plan, dict) and plan["weights_gib"]["bfloat16"] > 0, plan
        assert plan["recommendation"]["setting"].startswith("--device"), plan
    finally:
        process.stop()


@pytest.fixture(scope="module")
def memorized_release_engine(module_tmp: Path, release_memorized_dir: Path) -> Iterator[EngineProcess]:
    """One engine on the memorized release-format checkpoint for the language server tests below (each server has
    its own settings; none stops or restarts the engine)."""
    process = EngineProcess(release_memorized_dir, module_tmp / "memorized.sock", module_tmp / "memorized.log")
    yield process
    process.stop()


@pytest.fixture
async def lsp(
    isolated_env: Path, memorized_release_engine: EngineProcess
) -> AsyncIterator[tuple[LanguageClient, Path]]:
    """No deadline: on a loaded machine a deadline leaves an invoked inline completion's three candidates the floor
    of their schedule, and a candidate stopped half-denoised is an answer of its own (seen beside two other test
    runs: ``    return ``+ b``); what these tests check is the text a finished canvas gives."""
    async with attached_client(memorized_release_engine.socket_path, deadlineMs=0) as client:
        yield client, memorized_release_engine.socket_path


async def test_completion_is_the_instruction_models_answer_without_its_fence(
    lsp: tuple[LanguageClient, Path],
) -> None:
    client, _ = lsp
    open_document(client, URI, ANSWERED_PREFIX + ANSWERED_SUFFIX)
    result = await complete_when_ready(client, URI, *CURSOR)
    assert [item.text_edit.new_text for item in result.items] == [INSERTED]  # the model wrote ```python ... ```
    inline = await inline_complete(client, URI, *CURSOR)
    # An invoked inline completion is three canvases in one batch, unranked draws (the first row first): the test
    # checkpoint (400 training steps, checked on single canvases) answered one batched draw `    return ``+ b` in a
    # quiet fresh-clone run. What this checks is the fence taken off an instruction model's answer.
    assert INSERTED in [item.insert_text for item in inline.items], inline.items
    status = await status_of(client)
    assert status["layout"] == "chat"


@pytest.fixture
async def few_steps(
    isolated_env: Path, memorized_release_engine: EngineProcess
) -> AsyncIterator[tuple[LanguageClient, Path]]:
    """The release-format session with 4 denoising steps a completion (the ``steps`` setting): what the prompt's
    reuse depends on is the prompt, not the canvas, and 48 steps over a long prompt cost minutes on a CPU. No
    recent edits in the prompt: on a loaded machine the keystrokes come more than 2 s apart, each closes a burst,
    and the edit history's chunk (measured on its own in benchmarks/README.md) would change with every one."""
    socket_path = memorized_release_engine.socket_path
    async with attached_client(socket_path, steps=4, editHistoryTokens=0) as client:
        yield client, socket_path


async def test_typing_in_a_long_document_reuses_the_prompt(few_steps: tuple[LanguageClient, Path]) -> None:
    client, _ = few_steps
    source = long_source() + ANSWERED_PREFIX + ANSWERED_SUFFIX
    line = source[: source.index(ANSWERED_PREFIX)].count("\n") + 1
    open_document(client, URI, source)
    # Once, for the prompt to be cached. The memorized checkpoint, trained on a short document, seldom answers here
    # with text the editor keeps: asking until an item came took 10 to 55 s of asks.
    await until_ready(client)
    await complete(client, URI, line, 0)
    shares = []
    for version, typed in enumerate(["    z", "    zz", "    zzz", "    zzzz"], start=2):
        client.text_document_did_change(
            types.DidChangeTextDocumentParams(
                text_document=types.VersionedTextDocumentIdentifier(uri=URI, version=version),
                content_changes=[
                    types.TextDocumentContentChangePartial(
                        range=types.Range(
                            start=types.Position(line=line, character=0),
                            end=types.Position(line=line, character=len(typed) - 1),
                        ),
                        text=typed,
                    )
                ],
            )
        )
        await complete(client, URI, line, len(typed))
        status = await status_of(client)
        timings = status["lastTimings"]
        shares.append(timings["cached_tokens"] / timings["prompt_tokens"])
        assert timings["steps"] <= 4, timings
    assert min(shares) >= 0.9, shares


def _weights_bytes(folder: Path) -> int:
    return sum(path.stat().st_size for path in folder.glob("*.safetensors"))


@pytest.fixture(scope="module")
def int8_memorized_dir(release_memorized_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The memorized release-format checkpoint saved quantized (int8, experts included): its config says so, and
    the engine loads it quantized with no option."""
    pytest.importorskip("torchao", reason='int8 needs the quant extra: pip install "torchao==0.18.0"')
    from diffgemma_engine.loading.model import load_model
    from diffgemma_engine.loading.quantize import save_quantized

    folder = tmp_path_factory.mktemp("int8") / "release-memorized-int8"
    save_quantized(load_model(release_memorized_dir, "cpu", quantization="int8").model, folder)
    for item in release_memorized_dir.iterdir():  # the tokenizer, chat template, generation config
        if not item.name.endswith((".safetensors", ".safetensors.index.json")) and item.name != "config.json":
            shutil.copy(item, folder / item.name)
    return folder


async def test_an_int8_checkpoint_serves_the_same_completion_through_the_language_server(
    isolated_env: Path, release_memorized_dir: Path, int8_memorized_dir: Path
) -> None:
    quantized, plain = _weights_bytes(int8_memorized_dir), _weights_bytes(release_memorized_dir)
    print(f"quantized checkpoint: {quantized / 2**20:.2f} MiB on disk against {plain / 2**20:.2f} MiB in bf16")
    assert quantized < 0.75 * plain
    async with lsp_session(isolated_env, int8_memorized_dir, deadlineMs=0) as (client, socket_path):  # as lsp
        open_document(client, URI, ANSWERED_PREFIX + ANSWERED_SUFFIX)
        result = await complete_when_ready(client, URI, *CURSOR)
        assert [item.text_edit.new_text for item in result.items] == [INSERTED]
        log = (isolated_env / "xdg_state_home" / "diffgemma" / "engine.log").read_text()
        assert "int8: weights" in log and "experts eager, no_grad" in log, log[-2000:]
