"""Replay typing over real source files through the real diffgemma-lsp and engine; measure what a user feels.

    python -m benchmarks.keystroke_replay [--model DIR] [--requests 200] [--files N] [--chat-order ORDER]
                                          [--edit-history-tokens N] [--repo-context-tokens N] [--runtime R]

Each keystroke is a ``didChange`` followed by an inline completion request at the cursor, answered before the
next keystroke (a user who pauses on every character: the worst case for the engine). For each request it
records the end-to-end latency seen by the client and the engine's own time (queue + tokenize + encode + denoise, from
the server's ``diffgemma.status`` command); their difference is the language server's overhead.
``cache_hit_rate`` counts requests that reused work: the engine's encoded prefix (``prefix_reuse_rate``) or the
completion already shown, when the user typed what it suggested (``shown_completion_reuse_rate``);
``prompt_reuse_share`` is the share of prompt tokens whose encoding came from the previous keystroke
(``cached_tokens / prompt_tokens`` summed over the requests the engine served). ``--chat-order`` serves a chat
checkpoint with that layout order (``suffix_first`` or ``in_place``), to measure what the order buys.
The files are opened in a copy of the standard library's Python files, the workspace, so that the
workspace index (``--repo-context-tokens``, the setting's default; 0: off) is built from it before typing starts
and its chunks go into every prompt, as a user's repository's would. Writes
``benchmarks/results/keystroke_replay.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import random
import shutil
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.machine import machine_report
from benchmarks.plots import cdf
from benchmarks.report import RESULTS, add_step_argument, write_report
from diffgemma_engine.loading.checkpoint_files import HINTS_FILE
from diffgemma_engine.shared import protocol
from diffgemma_engine.shared.serve_options import RUNTIMES, Runtime, ServeOptions
from tests.support.engine import RawClient, wait_for_bind
from tests.support.lsp import RawLsp, server_command

SOURCES = ["textwrap.py", "json/encoder.py", "argparse.py", "difflib.py", "shlex.py", "fractions.py"]


def percentile(values: list[float], fraction: float) -> float:
    """Nearest-rank percentile."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(fraction * len(ordered)) - 1))]


def stdlib_workspace(scratch: Path) -> Path:
    """A copy of the standard library's Python files (site-packages aside) under ``scratch``: the workspace. The
    library's own folder is often inside a git repository that ignores it (pyenv's ``versions/``), and ignored
    files are never indexed (``repo/privacy.py``): served from there, the index held no file."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    workspace = scratch / "stdlib"
    for path in stdlib.rglob("*.py"):
        relative = path.relative_to(stdlib)
        if relative.parts[0] != "site-packages" and "__pycache__" not in relative.parts:
            (workspace / relative).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, workspace / relative)
    return workspace


def typing_sessions(stdlib: Path, files: int, seed: int) -> list[tuple[str, str, int]]:
    """(uri, source, offset where typing starts) at the start of function bodies in the files of ``stdlib``."""
    rng = random.Random(seed)
    sessions = []
    for name in SOURCES[:files]:
        text = (stdlib / name).read_text()
        starts = [i for i in range(len(text)) if text.startswith("\n    def ", i) or text.startswith("\ndef ", i)]
        for start in rng.sample(starts, min(4, len(starts))):
            body = text.find(":\n", start) + 2
            sessions.append(((stdlib / name).as_uri(), text, body))
    return sessions


def with_chat_order(model: Path | None, order: str, scratch: Path) -> Path:
    """A folder that serves ``model`` (its files linked) with the ``chat_order`` hint set to ``order``."""
    if model is None:
        raise SystemExit("--chat-order needs --model (a chat checkpoint; the shipped model is FIM)")
    folder = scratch / "model"
    folder.mkdir()
    hints: dict[str, object] = {}
    for path in Path(model).iterdir():
        if path.name == HINTS_FILE:
            hints = json.loads(path.read_text())
        else:
            (folder / path.name).symlink_to(path.resolve())
    (folder / HINTS_FILE).write_text(json.dumps({**hints, "chat_order": order}))
    return folder


@dataclasses.dataclass
class Samples:
    """What each keystroke's request gave."""

    latencies: list[float] = dataclasses.field(default_factory=list)
    engine_ms: list[float] = dataclasses.field(default_factory=list)
    steps: list[int] = dataclasses.field(default_factory=list)
    cached: list[int] = dataclasses.field(default_factory=list)
    """Prompt tokens whose encoding was reused; -1: answered from the completion shown, no engine work."""
    prompt_tokens: list[int] = dataclasses.field(default_factory=list)
    encode_ms: list[float] = dataclasses.field(default_factory=list)
    reuse_hits: int = 0

    def record(self, elapsed_ms: float, status: dict[str, Any]) -> None:
        """One request's end-to-end latency and the server's status after it."""
        self.latencies.append(elapsed_ms)
        if status["reuseHits"] > self.reuse_hits:  # answered from the shown completion: no engine work
            self.reuse_hits = status["reuseHits"]
            self.engine_ms.append(0.0)
            self.cached.append(-1)
            return
        timings = status["lastTimings"]
        self.engine_ms.append(protocol.Timings(**timings).total_ms)
        self.steps.append(timings["steps"])
        self.cached.append(timings["cached_tokens"])
        self.prompt_tokens.append(timings["prompt_tokens"])
        self.encode_ms.append(timings["encode_ms"])


class Session:
    """The language server under test, with its request ids."""

    def __init__(self, lsp: RawLsp) -> None:
        self.lsp = lsp
        self.request_id = 10

    async def ask(self, method: str, params: dict[str, object]) -> Any:
        """A request's reply."""
        self.request_id += 1
        self.lsp.request(self.request_id, method, params)
        return await self.lsp.reply(self.request_id)

    async def status(self) -> dict[str, Any]:
        """The ``diffgemma.status`` command's answer."""
        reply = await self.ask("workspace/executeCommand", {"command": "diffgemma.status", "arguments": []})
        status: dict[str, Any] = reply["result"]
        return status

    async def ready(self) -> dict[str, object]:
        """Wait until the engine answers and the workspace index is built; the index's status."""
        self.lsp.open("file:///warm.py", "def f(x):\n    ")
        while True:
            status = await self.status()
            if status["engine"] == "ready" and not status["workspaceIndex"]["building"]:
                index: dict[str, object] = status["workspaceIndex"]
                return index
            await asyncio.sleep(0.2)

    async def type_session(self, uri: str, text: str, start: int, samples: Samples, requests: int) -> None:
        """Type the 80 characters from ``start`` back into ``text`` one by one, a completion asked at each."""
        version = 1
        self.lsp.open(uri, text[:start] + text[start + 80 :])
        typed = text[start : start + 80]
        for count in range(1, len(typed) + 1):
            if len(samples.latencies) >= requests:
                return
            version += 1
            current = text[:start] + typed[:count] + text[start + 80 :]
            self.lsp.notify(
                "textDocument/didChange",
                {"textDocument": {"uri": uri, "version": version}, "contentChanges": [{"text": current}]},
            )
            before = current[: start + count]
            position = {"line": before.count("\n"), "character": len(before) - before.rfind("\n") - 1}
            sent = time.perf_counter()
            context = {"triggerKind": 2}  # Automatic: the user is typing
            await self.ask(
                "textDocument/inlineCompletion",
                {"textDocument": {"uri": uri}, "position": position, "context": context},
            )
            elapsed = (time.perf_counter() - sent) * 1000
            samples.record(elapsed, await self.status())


def engine_command(args: argparse.Namespace, socket_path: Path, model: Path | None) -> list[str]:
    """The engine the benchmark starts, with the engine's own ``serve`` options."""
    options = ServeOptions(
        engine_socket=socket_path, model=str(model) if model else None, step=args.step, runtime=Runtime(args.runtime)
    )
    return [sys.executable, "-m", "diffgemma_engine", "--log-level", "warning", *options.argv()]


async def replay(args: argparse.Namespace) -> dict[str, object]:
    """Run the typing sessions; returns the figures."""
    runtime = Path(tempfile.mkdtemp(prefix="dg-bench-", dir="/tmp"))
    socket_path = runtime / "engine.sock"
    model = with_chat_order(args.model, args.chat_order, runtime) if args.chat_order else args.model
    command = engine_command(args, socket_path, model)
    engine = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)  # noqa: ASYNC220
    await asyncio.to_thread(wait_for_bind, engine, socket_path)  # else the server starts an engine of its own
    lsp = await RawLsp.start(server_command(socket_path, model))
    samples = Samples()
    try:
        options = {
            "debounceMs": 0,
            "deadlineMs": 0,
            "editHistoryTokens": args.edit_history_tokens,
            "repoContextTokens": args.repo_context_tokens,
        }
        workspace = stdlib_workspace(runtime)
        await lsp.initialize(options, root_uri=workspace.as_uri())
        session = Session(lsp)
        index_status = await session.ready()
        client = await RawClient.connect(socket_path)
        engine_step = await client.wait_compiled()
        await client.close()
        for uri, text, start in typing_sessions(workspace, args.files, args.seed):
            if len(samples.latencies) >= args.requests:
                break
            await session.type_session(uri, text, start, samples, args.requests)
    finally:
        await lsp.stop()
        engine.terminate()
        engine.wait(10)
        shutil.rmtree(runtime, ignore_errors=True)
    return figures_of(args, samples, index_status, engine_step)


def figures_of(
    args: argparse.Namespace, samples: Samples, index_status: dict[str, object], engine_step: str
) -> dict[str, object]:
    """The benchmark's figures from its samples."""
    latencies, engine_ms, cached = samples.latencies, samples.engine_ms, samples.cached
    overhead = [total - own for total, own in zip(latencies, engine_ms, strict=True)]
    return {
        "model": str(args.model or "default"),
        "runtime": args.runtime,
        "edit_history_tokens": args.edit_history_tokens,
        "repo_context_tokens": args.repo_context_tokens,
        "workspace_index": index_status,
        "requests": len(latencies),
        "engine_step": engine_step,
        "p50_ms": round(percentile(latencies, 0.50), 1),
        "p95_ms": round(percentile(latencies, 0.95), 1),
        "mean_ms": round(statistics.fmean(latencies), 1),
        "engine_p50_ms": round(percentile(engine_ms, 0.50), 1),
        "lsp_overhead_p50_ms": round(percentile(overhead, 0.50), 2),
        "steps_mean": round(statistics.fmean(samples.steps), 2),
        "prompt_tokens_mean": round(statistics.fmean(samples.prompt_tokens), 1),
        "chat_order": args.chat_order or "",
        "prompt_reuse_share": round(sum(c for c in cached if c > 0) / max(sum(samples.prompt_tokens), 1), 3),
        "encode_ms_mean": round(statistics.fmean(samples.encode_ms), 2),
        "cache_hit_rate": round(sum(c != 0 for c in cached) / len(cached), 3),
        "prefix_reuse_rate": round(sum(c > 0 for c in cached) / len(cached), 3),
        "shown_completion_reuse_rate": round(sum(c < 0 for c in cached) / len(cached), 3),
        "samples_ms": {"end_to_end": [round(v, 1) for v in latencies], "engine": [round(v, 1) for v in engine_ms]},
    }


def main() -> None:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=None, help="checkpoint folder (default: the shipped model)")
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--files", type=int, default=len(SOURCES))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--chat-order", choices=("suffix_first", "in_place"), default=None)
    parser.add_argument(
        "--runtime",
        choices=RUNTIMES,
        default="transformers",
        help="the engine's --runtime (vllm: the vllm on PATH runs the canvases; default: the engine's own loop)",
    )
    parser.add_argument(
        "--repo-context-tokens",
        type=int,
        default=512,
        help="the repoContextTokens setting (0: no workspace index), to measure what its chunks cost",
    )
    parser.add_argument(
        "--edit-history-tokens",
        type=int,
        default=256,
        help="the editHistoryTokens setting (0: no recent edits in the prompt), to measure what they cost in reuse",
    )
    add_step_argument(parser)
    parser.add_argument("--out", type=Path, default=RESULTS / "keystroke_replay.json")
    args = parser.parse_args()
    machine = machine_report()  # before the benchmark loads the machine
    figures = asyncio.run(replay(args))
    samples = figures["samples_ms"]
    write_report(
        args.out,
        figures,
        machine,
        plot=lambda png: cdf(
            png,
            f"keystroke replay, {figures['requests']} requests: p50 {figures['p50_ms']} ms, p95 {figures['p95_ms']} ms",
            {"end to end (client)": samples["end_to_end"], "engine (queue + encode + denoise)": samples["engine"]},
        ),
        unprinted=("samples_ms",),
    )


if __name__ == "__main__":
    main()
