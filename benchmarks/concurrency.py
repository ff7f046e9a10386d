"""One client against four on one engine: completions per second.

    python -m benchmarks.concurrency [--model DIR] [--seconds 30] [--device cpu|cuda]

Each client connects to the same engine and sends infill requests back to back on its own document (a new
request only after the last reply), for ``--seconds`` each run. ``throughput_ratio_4_vs_1`` is completions per
second with four clients over completions per second with one: the engine denoises requests queued together
in one batch (``--max-batch``, default 4), so four clients share decoder passes. Writes
``benchmarks/results/concurrency.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

from benchmarks.machine import machine_report
from benchmarks.plots import bars
from benchmarks.report import RESULTS, add_step_argument, write_report
from diffgemma_engine.shared import protocol
from diffgemma_engine.shared.serve_options import ServeOptions
from tests.support.engine import RawClient, wait_for_bind


async def client_loop(socket_path: Path, index: int, seconds: float, text: str) -> list[float]:
    """Send requests back to back for ``seconds``; returns each request's latency in ms."""
    client = await RawClient.connect(socket_path)
    latencies: list[float] = []
    end = time.perf_counter() + seconds
    n = 0
    while time.perf_counter() < end:
        base = 4000 + index * 5000  # each client types into its own document: prefix reuse applies
        cut = base + n % 200
        sent = time.perf_counter()
        await client.send(
            protocol.Infill(
                id=str(n), uri=f"file:///c{index}.py", prefix=text[:cut], suffix=text[base + 200 : base + 600]
            )
        )
        reply = await client.receive(timeout=120)
        assert isinstance(reply, protocol.Result), reply
        latencies.append((time.perf_counter() - sent) * 1000)
        n += 1
    await client.close()
    return latencies


async def run(args: argparse.Namespace) -> dict[str, object]:
    """Start an engine, measure 1 then 4 clients."""
    socket_path = Path(tempfile.mkdtemp(prefix="dg-conc-", dir="/tmp")) / "engine.sock"
    options = ServeOptions(
        engine_socket=socket_path,
        model=str(args.model) if args.model else None,
        device=args.device or "auto",
        step=args.step,
    )
    command = [sys.executable, "-m", "diffgemma_engine", "--log-level", "warning", *options.argv()]
    engine = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)  # noqa: ASYNC220
    text = (Path(sysconfig.get_paths()["stdlib"]) / "argparse.py").read_text()
    try:
        await asyncio.to_thread(wait_for_bind, engine, socket_path)
        client = await RawClient.connect(socket_path)  # waits for the model
        engine_step = await client.wait_compiled()
        await client.close()
        results = {}
        for clients in (1, 4):
            runs = await asyncio.gather(*(client_loop(socket_path, i, args.seconds, text) for i in range(clients)))
            done = sum(len(latencies) for latencies in runs)
            every = [value for latencies in runs for value in latencies]
            results[clients] = {
                "completions": done,
                "per_s": round(done / args.seconds, 2),
                "latency_p50_ms": round(statistics.median(every), 1),
            }
    finally:
        engine.terminate()
        engine.wait(10)
    return {
        "model": str(args.model or "default"),
        "device": args.device or "auto",
        "seconds_per_run": args.seconds,
        "engine_step": engine_step,
        "one_client": results[1],
        "four_clients": results[4],
        "throughput_ratio_4_vs_1": round(results[4]["per_s"] / results[1]["per_s"], 3),
    }


def main() -> None:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=None)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--device", default=None, help="the engine's --device (default: its own choice, auto)")
    add_step_argument(parser)
    parser.add_argument("--out", type=Path, default=RESULTS / "concurrency.json")
    args = parser.parse_args()
    machine = machine_report()  # before the benchmark loads the machine
    figures = asyncio.run(run(args))
    write_report(
        args.out,
        figures,
        machine,
        plot=lambda png: bars(
            png,
            f"one engine: throughput 4 clients / 1 client = {figures['throughput_ratio_4_vs_1']}",
            ["1 client", "4 clients"],
            [figures["one_client"]["per_s"], figures["four_clients"]["per_s"]],
            "completions/s",
        ),
    )


if __name__ == "__main__":
    main()
