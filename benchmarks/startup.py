"""Time from starting ``diffgemma-engine serve`` (shipped model, CPU) to an engine ready to answer, and to the
first completion.

    python -m benchmarks.startup [--model DIR] [--runs 3] [--threads N]

Each run starts a fresh engine process on a private socket, connects as the language server does, and records
when the socket appears, when the model is loaded and warmed up (``ready``), and when a first infill has come
back. Writes ``benchmarks/results/startup.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.machine import machine_report
from benchmarks.report import RESULTS, write_report
from diffgemma_engine.shared import protocol
from diffgemma_engine.shared.serve_options import ServeOptions
from tests.support.engine import RawClient


async def one_run(model: Path | None, threads: int | None) -> dict[str, float]:
    """One fresh engine: seconds from its start to the socket, to ``ready`` and to the first completion."""
    socket_path = Path(tempfile.mkdtemp(prefix="dg-start-", dir="/tmp")) / "engine.sock"
    options = ServeOptions(engine_socket=socket_path, model=str(model) if model else None, threads=threads)
    command = [sys.executable, "-m", "diffgemma_engine", "--log-level", "warning", *options.argv()]
    started = time.perf_counter()
    engine = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)  # noqa: ASYNC220
    try:
        while not socket_path.exists():  # noqa: ASYNC110
            await asyncio.sleep(0.01)
        listening = time.perf_counter()
        client = await RawClient.connect(socket_path)  # the handshake, then the Ready message once loaded
        ready = time.perf_counter()
        await client.send(protocol.Infill(id="1", uri="file:///a.py", prefix="def add(a, b):\n"))
        result = await client.receive()
        assert isinstance(result, protocol.Result), result
        answered = time.perf_counter()
        await client.close()
    finally:
        engine.terminate()
        engine.wait(10)
    return {
        "socket_s": round(listening - started, 3),
        "ready_s": round(ready - started, 3),
        "first_completion_s": round(answered - started, 3),
    }


def main() -> None:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=None, help="checkpoint folder (default: the shipped model)")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--out", type=Path, default=RESULTS / "startup.json")
    args = parser.parse_args()
    machine = machine_report()  # before the benchmark loads the machine
    runs = [asyncio.run(one_run(args.model, args.threads)) for _ in range(args.runs)]
    figures = {
        "model": str(args.model or "default"),
        "runs": runs,
        **{f"{key}_median": statistics.median(run[key] for run in runs) for key in runs[0]},
    }
    write_report(args.out, figures, machine)


if __name__ == "__main__":
    main()
