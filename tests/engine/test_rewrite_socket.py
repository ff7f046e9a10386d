"""Rewrites through a real ``diffgemma-engine serve`` process on a real socket, and through ``infill --start``."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from diffgemma_engine.shared import protocol
from tests.support.engine import EngineProcess, RawClient
from tests.support.models import MEMORIZED_MIDDLE, MEMORIZED_PREFIX, MEMORIZED_SUFFIX

WRONG_MIDDLE = MEMORIZED_MIDDLE.replace("a + b", "a - b")


@pytest.fixture(scope="module")
def engine(memorized_model_dir: Path, module_tmp: Path) -> Iterator[EngineProcess]:
    process = EngineProcess(memorized_model_dir, module_tmp / "run" / "engine.sock", module_tmp / "engine.log")
    yield process
    process.stop()


@pytest.fixture
async def client(engine: EngineProcess) -> AsyncIterator[RawClient]:
    connection = await RawClient.connect(engine.socket_path)
    yield connection
    await connection.close()


def rewrite(request_id: str, start: str = WRONG_MIDDLE, **fields: object) -> protocol.Infill:
    values: dict[str, object] = dict(
        id=request_id, uri="file:///a.py", prefix=MEMORIZED_PREFIX, suffix=MEMORIZED_SUFFIX, seed=0, strength=0.5
    )
    values.update(fields)
    segments = [protocol.StartSegment(text=start)] if start else []
    return protocol.Infill(start=segments, **values)  # type: ignore[arg-type]


async def test_the_handshake_lists_the_rewrite_feature(engine: EngineProcess) -> None:
    connection = await RawClient.connect(engine.socket_path, hello=False)
    await connection.send(protocol.Hello(protocol=protocol.PROTOCOL_VERSION, client="test", pid=os.getpid()))
    hello = await connection.receive()
    await connection.close()
    assert isinstance(hello, protocol.HelloOk)
    assert hello.features == [protocol.REWRITE_FEATURE, protocol.WINDOWS_FEATURE] == ["rewrite", "windows"]


async def test_a_rewrite_returns_the_memorized_middle(client: RawClient) -> None:
    await client.send(rewrite("1"))
    result = await client.receive()
    assert isinstance(result, protocol.Result), result
    assert (result.id, result.text, result.stop) == ("1", MEMORIZED_MIDDLE, protocol.StopReason.EOS)
    assert 1 <= result.timings.steps <= 8  # half of the checkpoint's 16


def window(start: str = WRONG_MIDDLE, prefix: str = MEMORIZED_PREFIX) -> protocol.Window:
    return protocol.Window(prefix=prefix, suffix=MEMORIZED_SUFFIX, start=[protocol.StartSegment(text=start)])


async def test_a_rewrite_with_more_windows_answers_each_from_one_batch(
    engine: EngineProcess, client: RawClient
) -> None:
    """Issue 45's next-edit chain: the other places an edit implies ride in one request and one batch; each window
    is answered in order, as it would be alone (two draws each: six canvas rows in one decoder pass). The checkpoint
    knows one prompt: the window of another prompt gets an answer of its own, after the one it knows."""
    other_prefix = "# another place of the file\n" + MEMORIZED_PREFIX
    await client.send(rewrite("chain", windows=[window(), window(prefix=other_prefix)], candidates=2, seed=None))
    result = await client.receive()
    assert isinstance(result, protocol.Result), result
    assert (result.id, result.text, result.stop) == ("chain", MEMORIZED_MIDDLE, protocol.StopReason.EOS)
    assert len(result.windows) == 2 and result.windows[0].text == MEMORIZED_MIDDLE, result
    assert result.windows[0].stop is protocol.StopReason.EOS and result.windows[1].stop is not None
    assert result.timings.prompt_tokens > 0
    assert "request chain: eos" in engine.log() and "(3 windows in one batch)" in engine.log()


BAD_REWRITES = {
    "strength 0": (dict(strength=0.0), "strength must be more than 0 and at most 1, got 0.0"),
    "strength over 1": (dict(strength=1.5), "strength must be more than 0 and at most 1, got 1.5"),
    "negative strength": (dict(strength=-0.25), "got -0.25"),
    "strength NaN": (dict(strength=math.nan), "got nan"),
    "start over a canvas": (dict(start="x = 1\n" * 20), "the selection is 80 tokens, more than one canvas of 32"),
    "start of many characters": (dict(start="x" * 100_000), "the selection is 100000 characters"),
    "instruction over the cap": (dict(instruction="y" * 2_001), "the instruction is 2001 characters, more than 2000"),
    "too many windows": (dict(windows=[window()] * (protocol.MAX_WINDOWS + 1)), "at most 8 in one request, got 9"),
    "windows without a start": (dict(windows=[window()], start=""), "the request needs its own start"),
    "a window over a canvas": (dict(windows=[window(start="x = 1\n" * 20)]), "the selection is 80 tokens"),
}


@pytest.mark.parametrize("case", BAD_REWRITES, ids=list(BAD_REWRITES))
async def test_a_bad_rewrite_answers_bad_request_and_the_engine_keeps_serving(client: RawClient, case: str) -> None:
    fields, message = BAD_REWRITES[case]
    await client.send(rewrite("bad", **fields))
    error = await client.receive()
    assert isinstance(error, protocol.Error), error
    assert (error.id, error.code) == ("bad", protocol.ErrorCode.BAD_REQUEST)
    assert message in error.message
    await client.send(rewrite("good"))
    result = await client.receive()
    assert isinstance(result, protocol.Result) and result.text == MEMORIZED_MIDDLE


def test_the_infill_cli_prints_the_replacement_of_a_start_file(memorized_model_dir: Path, short_tmp: Path) -> None:
    for name, text in (("prefix.txt", MEMORIZED_PREFIX), ("suffix.txt", MEMORIZED_SUFFIX), ("start.txt", WRONG_MIDDLE)):
        (short_tmp / name).write_text(text)
    command = [sys.executable, "-m", "diffgemma_engine", "infill", "--model", str(memorized_model_dir)]
    for name in ("prefix", "suffix", "start"):
        command += [f"--{name}", str(short_tmp / f"{name}.txt")]
    out = subprocess.run(
        [*command, "--strength", "0.5", "--instruction", "Fix it."],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert out.stdout == MEMORIZED_MIDDLE + "\n"
    steps = int(out.stderr.split("steps=", 1)[1].split()[0])
    assert 1 <= steps <= 8
    refused = subprocess.run([*command, "--strength", "2"], capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2 and "strength must be more than 0 and at most 1, got 2.0" in refused.stderr
