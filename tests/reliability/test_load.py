"""Load: 8 language-server clients x 250 requests, with cancels and superseding requests, on one engine."""

from __future__ import annotations

import asyncio
import random
import signal
from pathlib import Path

import pytest

from diffgemma_engine.shared import protocol
from tests.e2e.test_lsp_engine import _kill_engine
from tests.support.engine import EngineProcess, RawClient
from tests.support.lsp import RawLsp, server_command

pytestmark = pytest.mark.e2e
CLIENTS = 8
REQUESTS = 250
WINDOW = 6
"""Requests a client keeps in flight, as an editor does while the user types."""


async def _stats(socket_path: Path) -> protocol.Stats:
    client = await RawClient.connect(socket_path)
    await client.send(protocol.GetStats(id="s"))
    stats = await client.receive()
    await client.close()
    assert isinstance(stats, protocol.Stats)
    return stats


async def _status(lsp: RawLsp, request_id: int) -> dict[str, object]:
    lsp.request(request_id, "workspace/executeCommand", {"command": "diffgemma.status", "arguments": []})
    reply = await lsp.reply(request_id)
    return reply["result"]


async def _drive(lsp: RawLsp, seed: int) -> tuple[int, int, int]:
    """Send REQUESTS completions over 3 documents with random edits and cancels; returns (results, cancels, errors)."""
    rng = random.Random(seed)
    uris = [f"file:///load/{seed}/{n}.py" for n in range(3)]
    versions = dict.fromkeys(uris, 1)
    for uri in uris:
        lsp.open(uri, "def f(x):\n    return x\n\n")
    first_id = 1000
    in_flight: list[int] = []
    cancels = 0
    for n in range(REQUESTS):
        request_id = first_id + n
        uri = rng.choice(uris)
        if rng.random() < 0.2:  # the user typed: a new version, which also makes pending results stale
            versions[uri] += 1
            lsp.notify(
                "textDocument/didChange",
                {
                    "textDocument": {"uri": uri, "version": versions[uri]},
                    "contentChanges": [{"text": f"def f(x):\n    return x + {versions[uri]}\n\n"}],
                },
            )
        method = "textDocument/completion" if rng.random() < 0.5 else "textDocument/inlineCompletion"
        context = {"triggerKind": 1} if method == "textDocument/completion" else {"triggerKind": rng.choice([1, 2])}
        lsp.request(
            request_id,
            method,
            {"textDocument": {"uri": uri}, "position": {"line": 2, "character": 0}, "context": context},
        )
        in_flight.append(request_id)
        if rng.random() < 0.15:
            lsp.notify("$/cancelRequest", {"id": rng.choice(in_flight)})
            cancels += 1
        if len(in_flight) >= WINDOW:
            await lsp.reply(in_flight.pop(0), timeout=120)
    for request_id in in_flight:
        await lsp.reply(request_id, timeout=120)
    ids = range(first_id, first_id + REQUESTS)
    assert all(len(lsp.responses.get(i, [])) == 1 for i in ids), "a request got no reply or two"
    errors = [lsp.responses[i][0]["error"] for i in ids if "error" in lsp.responses[i][0]]
    assert all(error["code"] == -32800 for error in errors), errors[:3]  # only RequestCancelled
    return REQUESTS - len(errors), cancels, len(errors)


async def test_eight_clients_every_request_answered_once(short_tmp: Path, random_model_dir: Path) -> None:
    socket_path = short_tmp / "run" / "engine.sock"
    engine = EngineProcess(random_model_dir, socket_path, short_tmp / "engine.log", ["--max-pending", "256"])
    lsps: list[RawLsp] = []
    try:
        warm = await RawClient.connect(socket_path)  # waits for the model
        await warm.close()
        settings = {"debounceMs": 0, "steps": 2, "canvasLength": 8, "deadlineMs": 0}
        lsps = [await RawLsp.start(server_command(socket_path, random_model_dir)) for _ in range(CLIENTS)]
        for lsp in lsps:
            await lsp.initialize(settings)
        await asyncio.gather(*(_status(lsp, 2) for lsp in lsps))  # every server connected to the engine
        await asyncio.sleep(1.0)
        await _drive(lsps[0], seed=99)  # warm-up round for the memory baseline
        before = await _stats(socket_path)

        outcomes = await asyncio.gather(*(_drive(lsp, seed) for seed, lsp in enumerate(lsps)))

        after = await _stats(socket_path)
        statuses = [await _status(lsp, 3) for lsp in lsps]
        answered = sum(results + errors for results, _, errors in outcomes)
        growth = (after.rss_mb - before.rss_mb) / before.rss_mb
        print(
            f"clients {CLIENTS} x {REQUESTS}: requests answered {answered}, lost 0, "
            f"cancels sent {sum(c for _, c, _ in outcomes)}, cancelled replies {sum(e for _, _, e in outcomes)}, "
            f"engine replies {after.replies}, engine rss {before.rss_mb:.0f} -> {after.rss_mb:.0f} MiB "
            f"({growth:+.1%}), server tasks after {[s['tasks'] for s in statuses]}"
        )
        assert answered == CLIENTS * REQUESTS
        assert growth < 0.10
        assert all(s["pending"] == 0 and s["inflight"] == 0 for s in statuses), statuses
        assert all(int(s["tasks"]) <= 8 for s in statuses), statuses  # no task leaks: only the server's own
        assert engine.process.poll() is None
    finally:
        for lsp in lsps:
            await lsp.stop()
        engine.stop()
        _kill_engine(socket_path, signal.SIGKILL)


async def test_a_full_queue_answers_busy(short_tmp: Path, random_model_dir: Path) -> None:
    socket_path = short_tmp / "run" / "engine.sock"
    engine = EngineProcess(random_model_dir, socket_path, short_tmp / "engine.log", ["--max-pending", "2"])
    try:
        client = await RawClient.connect(socket_path)
        for n in range(8):
            await client.send(protocol.Infill(id=str(n), uri=f"file:///{n}.py", prefix="x", max_steps=50))
        replies = [await client.receive() for _ in range(8)]
        busy = [r for r in replies if isinstance(r, protocol.Error) and r.code is protocol.ErrorCode.BUSY]
        assert busy and "limit 2" in busy[0].message
        assert sorted(r.id for r in replies) == [str(n) for n in range(8)]
        await client.close()
    finally:
        engine.stop()
