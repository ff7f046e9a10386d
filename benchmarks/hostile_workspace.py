"""Completion latency on one file while the language server indexes a hostile workspace, against an empty one; and
how long the server takes to exit after ``exit`` (issue 42's done-when).

    python -m benchmarks.hostile_workspace [--small-files 100000] [--depth 2000] [--completions 40]

The hostile workspace: files of nested brackets up to the walk's size limit (Lua braces, Python lists, JavaScript
objects: the grammars whose queries were quadratic in the depth), named pipes called ``*.py``, a folder ``--depth``
levels deep with a source file at its bottom, and ``--small-files`` small Python files. The real language server (a
subprocess, over stdio) completes in ``main.py`` of each workspace, right after ``initialized`` (while the index
builds), against a stand-in engine that answers every request at once with nothing (tests/support/fake_engine.py):
the latency is the language server's own, the figure the index can slow down. Then ``shutdown`` and ``exit``, timed
to the process's end. Writes ``benchmarks/results/hostile_workspace.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.report import RESULTS, write_report
from diffgemma_lsp.repo.files import MAX_FILE_BYTES
from tests.support.fake_engine import answering_empty, serving
from tests.support.lsp import RawLsp, server_command

MAIN = "import os\n\n\ndef home():\n    return os.path.join(os.environ['HOME'], 'x')\n\n\ndef main():\n    return "


def nested(opens: str, closes: str, prefix: str) -> str:
    depth = (MAX_FILE_BYTES - len(prefix) - 2) // (len(opens) + len(closes))
    return prefix + opens * depth + closes * depth + "\n"


def hostile(root: Path, small_files: int, depth: int) -> None:
    """Fill ``root`` with the hostile workspace (see the module's docstring)."""
    (root / "nested.lua").write_text(nested("{", "}", "x = "))
    (root / "nested.py").write_text(nested("[", "]", "x = "))
    (root / "nested.js").write_text(nested("{a:", "}", "const x = "))
    for name in ("pipe.py", "lib/pipe.lua", "lib/pipe.js"):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        os.mkfifo(root / name)
    descriptor = os.open(root, os.O_RDONLY)
    try:
        for _ in range(depth):  # relative to an open folder: the absolute path outgrows PATH_MAX
            os.mkdir("d", dir_fd=descriptor)
            inner = os.open("d", os.O_RDONLY, dir_fd=descriptor)
            os.close(descriptor)
            descriptor = inner
        with os.fdopen(os.open("bottom.py", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=descriptor), "w") as file:
            file.write("def at_the_bottom():\n    return 1\n")
    finally:
        os.close(descriptor)
    for number in range(small_files):
        folder = root / "many" / f"p{number // 1000:03d}"
        if number % 1000 == 0:
            folder.mkdir(parents=True)
        (folder / f"m{number}.py").write_text(f"def function_{number}(value):\n    return value + {number}\n")


def remove(root: Path) -> None:
    """Remove ``root``, its deep folder one level at a time (shutil.rmtree recurses)."""
    top, level = root / "d", 0
    while (top / "d").exists():
        moved = root / f"level{level}"
        os.rename(top / "d", moved)
        shutil.rmtree(top)
        top, level = moved, level + 1
    shutil.rmtree(root)


async def measure(root: Path, completions: int, run: Path) -> dict[str, object]:
    """Completion latencies in ``root``'s main.py (ms) and the seconds from ``exit`` to the process's end."""
    (root / "main.py").write_text(MAIN)
    uri = (root / "main.py").as_uri()
    line, column = MAIN.count("\n"), len(MAIN.rsplit("\n", 1)[-1])
    socket = run / "engine.sock"
    async with serving(socket, answering_empty()):
        lsp = await RawLsp.start(server_command(socket, None))
        try:
            await lsp.initialize({"diffgemma": {"debounceMs": 0}}, root_uri=root.as_uri())
            lsp.open(uri, MAIN)
            latencies = []
            for number in range(completions):
                request_id = 100 + number
                started = time.perf_counter()
                params = {
                    "textDocument": {"uri": uri},
                    "position": {"line": line, "character": column},
                    "context": {"triggerKind": 1},
                }
                lsp.request(request_id, "textDocument/completion", params)
                await lsp.reply(request_id, timeout=600)
                latencies.append((time.perf_counter() - started) * 1000)
                await asyncio.sleep(0.05)
            lsp.request(2, "workspace/executeCommand", {"command": "diffgemma.status"})
            index = (await lsp.reply(2, timeout=600))["result"]["workspaceIndex"]
            lsp.request(3, "shutdown")
            await lsp.reply(3, timeout=600)
            started = time.perf_counter()
            lsp.notify("exit")
            async with asyncio.timeout(60):
                await lsp.process.wait()
            exit_s = time.perf_counter() - started
        finally:
            await lsp.stop()
    return {
        "completion_ms_p50": round(statistics.median(latencies), 2),
        "completion_ms_p90": round(sorted(latencies)[int(len(latencies) * 0.9)], 2),
        "completion_ms_max": round(max(latencies), 2),
        "exit_s": round(exit_s, 3),
        "index": index,
    }


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--small-files", type=int, default=100_000)
    parser.add_argument("--depth", type=int, default=2_000)
    parser.add_argument("--completions", type=int, default=40)
    parser.add_argument("--output", type=Path, default=RESULTS / "hostile_workspace.json")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="dg-hostile-") as temporary:
        base = Path(temporary)
        empty, hostile_root, run = base / "empty", base / "hostile", base / "run"
        for folder in (empty, hostile_root, run):
            folder.mkdir(mode=0o700)
        started = time.perf_counter()
        hostile(hostile_root, args.small_files, args.depth)
        built_s = time.perf_counter() - started
        try:
            figures: dict[str, object] = {
                "empty": asyncio.run(measure(empty, args.completions, run)),
                "hostile": asyncio.run(measure(hostile_root, args.completions, run)),
            }
        finally:
            remove(hostile_root)
    empty_p50 = figures["empty"]["completion_ms_p50"]  # type: ignore[index]
    hostile_p50 = figures["hostile"]["completion_ms_p50"]  # type: ignore[index]
    figures.update(
        small_files=args.small_files,
        depth=args.depth,
        nested_file_bytes=MAX_FILE_BYTES,
        workspace_written_s=round(built_s, 1),
        p50_ratio=round(hostile_p50 / empty_p50, 2),
        command=" ".join(["python -m benchmarks.hostile_workspace", *argv]),
    )
    write_report(args.output, figures, {"cpus": os.cpu_count(), "load": os.getloadavg()})
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
