"""Fuzzing: the wire protocol (100,000 frames) and the language server's inputs. No crash, no hang, clear errors."""

from __future__ import annotations

import asyncio
import json
import random
from pathlib import Path

import pytest

from diffgemma_engine.shared import frames, protocol
from diffgemma_lsp.features.rewrite import REWRITE_COMMAND
from tests.support.engine import EngineProcess, RawClient
from tests.support.lsp import RawLsp, server_command
from tests.support.models import MEMORIZED_MIDDLE, MEMORIZED_PREFIX, MEMORIZED_SUFFIX

FRAMES = 100_000
LIVE_FRAMES = 3_000
VALID = [
    frames.encode(protocol.Infill(id="1", uri="file:///a.py", prefix="def f(", suffix=")", max_steps=1))[4:],
    frames.encode(protocol.Cancel(id="1"))[4:],
    frames.encode(protocol.Hello(protocol=1, client="x"))[4:],
    frames.encode(protocol.GetStats(id="s"))[4:],
]
JUNK_VALUES: list[object] = [None, True, -1, 2**63, 1.5, "", "\ud800", [], {}, "x" * 1000, [1, "a"], {"a": None}]


def mutate(rng: random.Random) -> bytes:
    """One malformed (or occasionally valid) frame body."""
    body = rng.choice(VALID)
    kind = rng.randrange(7)
    if kind == 0:  # truncated
        return body[: rng.randrange(len(body))]
    if kind == 1:  # random bytes flipped, often invalid UTF-8
        data = bytearray(body)
        for _ in range(rng.randrange(1, 6)):
            data[rng.randrange(len(data))] = rng.randrange(256)
        return bytes(data)
    if kind == 2:  # a field with the wrong type
        raw = json.loads(body)
        raw[rng.choice(list(raw))] = rng.choice(JUNK_VALUES)
        return json.dumps(raw).encode()
    if kind == 3:  # an unknown or missing type
        raw = json.loads(body)
        if rng.random() < 0.5:
            raw.pop("type")
        else:
            raw["type"] = rng.choice(["", "Infill", "result", "stats", "x" * 50, 7])
        return json.dumps(raw).encode()
    if kind == 4:  # random bytes
        return bytes(rng.randrange(256) for _ in range(rng.randrange(64)))
    if kind == 5:  # JSON that is not an object
        return json.dumps(rng.choice(JUNK_VALUES)).encode(errors="surrogatepass") if rng.random() < 0.9 else b"\xc3"
    return body


def test_hundred_thousand_frames_decode_or_fail_clearly() -> None:
    rng = random.Random(1234)
    outcomes = {"decoded": 0, "refused": 0}
    for _ in range(FRAMES):
        try:
            frames.decode(mutate(rng))
            outcomes["decoded"] += 1
        except frames.ProtocolError as exc:
            assert exc.code in protocol.ErrorCode and str(exc)
            outcomes["refused"] += 1
    print(f"frames fuzzed: {FRAMES} ({outcomes}), crashes 0")
    assert sum(outcomes.values()) == FRAMES


@pytest.mark.e2e
async def test_live_engine_survives_fuzzed_frames(memorized_engine: EngineProcess) -> None:
    engine = memorized_engine  # the module's: the language server tests below then run on the engine fuzzed here
    rng = random.Random(99)
    client = await RawClient.connect(engine.socket_path)
    expected_replies = 0
    for _ in range(LIVE_FRAMES):
        body = mutate(rng)
        try:
            message = frames.decode(body)
        except frames.ProtocolError:
            expected_replies += 1  # an Error
        else:
            expected_replies += not isinstance(message, protocol.Cancel)  # Cancel has no reply
        await client.send_raw(frames.HEADER.pack(len(body)) + body)
    replies = [await client.receive(timeout=120) for _ in range(expected_replies)]
    with pytest.raises(asyncio.TimeoutError):
        await client.receive(timeout=1.0)
    errors = sum(isinstance(r, protocol.Error) for r in replies)
    print(f"live frames fuzzed: {LIVE_FRAMES}, replies {len(replies)} ({errors} errors), engine alive")
    await client.send(
        protocol.Infill(id="ok", uri="file:///ok.py", prefix=MEMORIZED_PREFIX, suffix=MEMORIZED_SUFFIX, seed=0)
    )
    ok = await client.receive()
    assert isinstance(ok, protocol.Result) and ok.text == MEMORIZED_MIDDLE
    await client.close()
    assert engine.process.poll() is None


LSP_CASES = 400


@pytest.mark.e2e
async def test_language_server_survives_bad_positions_and_documents(
    isolated_env: Path, memorized_engine: EngineProcess
) -> None:
    """Positions out of range, unknown URIs, CRLF, surrogate pairs, a huge document: a result or a clear error."""
    lsp = await RawLsp.start(server_command(memorized_engine.socket_path, None))
    rng = random.Random(7)
    documents = {
        "file:///f/crlf.py": "def f():\r\n    return 1\r\n\r\nx = '😀😀'\r\n",
        "file:///f/emoji.py": "s = '😀𝔘𝔫𝔦'  # 🙂\nprint(s)\n",
        "file:///f/empty.py": "",
        "file:///f/huge.py": "y = 2\n" * 800_000,
        "file:///f/ok.py": MEMORIZED_PREFIX + MEMORIZED_SUFFIX,
    }
    try:
        await lsp.initialize({"debounceMs": 0, "steps": 2, "extraContextTokens": 0})
        for uri, text in documents.items():
            lsp.open(uri, text)
        uris = [*documents, "file:///f/never-opened.py", "untitled:Untitled-1", "not a uri"]
        codes: dict[str, int] = {}
        for n in range(LSP_CASES):
            method = rng.choice(["textDocument/completion", "textDocument/inlineCompletion"])
            position = {
                "line": rng.choice([0, 1, 2, 3, 5, 10**6, 2**31 - 1]),
                "character": rng.choice([0, 1, 4, 5, 6, 7, 99, 2**31 - 1]),
            }
            params: dict[str, object] = {
                "textDocument": {"uri": rng.choice(uris)},
                "position": position,
                "context": {"triggerKind": 1},
            }
            if rng.random() < 0.05:
                params = rng.choice([{}, {"textDocument": 5}, {"position": "x"}, None])
            lsp.request(10_000 + n, method, params)
            reply = await lsp.reply(10_000 + n)
            key = "result" if "result" in reply else f"error {reply['error']['code']}"
            codes[key] = codes.get(key, 0) + 1
            if "error" in reply:
                assert reply["error"]["code"] in (-32602, -32603) and reply["error"]["message"]
        print(f"language server inputs fuzzed: {LSP_CASES}, outcomes {codes}")
        assert codes.get("error -32603", 0) < LSP_CASES * 0.1  # internal errors only from malformed params
        lsp.request(
            2,
            "textDocument/completion",
            {
                "textDocument": {"uri": "file:///f/ok.py"},
                "position": {"line": 1, "character": 0},
                "context": {"triggerKind": 1},
            },
        )
        deadline = asyncio.get_running_loop().time() + 120
        while True:  # the engine may still be loading
            items = (await lsp.reply(2))["result"]["items"]
            if items or asyncio.get_running_loop().time() > deadline:
                break
            await asyncio.sleep(0.3)
            lsp.responses.pop(2)
            lsp.request(
                2,
                "textDocument/completion",
                {
                    "textDocument": {"uri": "file:///f/ok.py"},
                    "position": {"line": 1, "character": 0},
                    "context": {"triggerKind": 1},
                },
            )
        assert items[0]["textEdit"]["newText"] == MEMORIZED_MIDDLE
        assert lsp.process.returncode is None
    finally:
        await lsp.stop()


REWRITE_CASES = 300
REWRITE_JUNK: list[object] = [-1, 2**31, 2**63, -(2**31) - 1, 1.5, 1.0, True, None, "1", [], {}]
"""Values no position or version may take (a position's line and character: 0 to 2**31 - 1)."""


@pytest.mark.e2e
async def test_the_rewrite_command_refuses_bad_arguments_and_huge_selections_clearly(
    isolated_env: Path, memorized_engine: EngineProcess
) -> None:
    """The rewrite command's argument with junk where its numbers go (huge, negative, floats, bools): always an
    InvalidParams error naming what is wrong, never an internal one; a 5.4 MB selection is refused before the
    engine is asked, saying what to do."""
    lsp = await RawLsp.start(server_command(memorized_engine.socket_path, None))
    rng = random.Random(31)
    edits = {"applyEdit": True, "workspaceEdit": {"documentChanges": True}}
    try:
        await lsp.initialize({"debounceMs": 0, "extraContextTokens": 0}, {"workspace": edits})
        lsp.open("file:///f/ok.py", MEMORIZED_PREFIX + MEMORIZED_MIDDLE + MEMORIZED_SUFFIX, version=3)
        lsp.open("file:///f/huge.py", "y = 2\n" * 900_000)
        codes: dict[str, int] = {}
        for n in range(REWRITE_CASES):
            numbers: list[object] = [rng.choice([0, 1, 2, 2**31 - 1]) for _ in range(4)]
            numbers[rng.randrange(4)] = rng.choice(REWRITE_JUNK)
            version = rng.choice([1, 2, *REWRITE_JUNK])  # never the document's 3: no rewrite runs
            line, character, end_line, end_character = numbers
            argument = {
                "uri": "file:///f/ok.py",
                "range": span_argument(line, character, end_line, end_character),
                "version": version,
            }
            lsp.request(20_000 + n, "workspace/executeCommand", {"command": REWRITE_COMMAND, "arguments": [argument]})
            reply = await lsp.reply(20_000 + n)
            key = "result" if "result" in reply else f"error {reply['error']['code']}"
            codes[key] = codes.get(key, 0) + 1
            if "error" in reply:
                assert reply["error"]["code"] == -32602, reply
                assert reply["error"]["message"].startswith(REWRITE_COMMAND), reply
        huge = {"uri": "file:///f/huge.py", "range": span_argument(0, 0, 900_000, 0), "version": 1}
        lsp.request(3, "workspace/executeCommand", {"command": REWRITE_COMMAND, "arguments": [huge]})
        result = (await lsp.reply(3))["result"]
        print(f"rewrite arguments fuzzed: {REWRITE_CASES}, outcomes {codes}; 5.4 MB selection: {result['reason']}")
        assert codes.get("error -32602", 0) >= REWRITE_CASES // 2 and "error -32603" not in codes
        assert result["applied"] is False
        assert result["reason"].startswith("the selection is 5400000 characters, more than one canvas of")
        assert (
            "(at most " in result["reason"] and "select less" in result["reason"]
        )  # the server's words, not the engine's
        assert lsp.process.returncode is None
    finally:
        await lsp.stop()


def span_argument(start_line: object, start_character: object, end_line: object, end_character: object) -> object:
    """An LSP range as JSON (whatever its numbers are)."""
    return {
        "start": {"line": start_line, "character": start_character},
        "end": {"line": end_line, "character": end_character},
    }
