"""``diffgemma-lsp doctor``: is the engine reachable, what does it serve, how fast, what went wrong lately.

Exit status: 0 healthy, 1 reachable but not serving (loading, failed, recent errors), 2 unreachable.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import attrs

from diffgemma_engine.shared import frames, protocol, socket_paths
from diffgemma_engine.shared.units import GIB, size_text
from diffgemma_lsp.settings import Settings

TIMEOUT_S = 10.0
LOAD_WAIT_S = 60.0
"""How long the doctor waits for a loading model to be ready or to fail."""
NOT_REPRODUCIBLE = (
    "not reproducible: vLLM takes no seed for a diffusion model, so the same request (candidates too) may answer "
    "differently each time"
)
"""What doctor says of an engine whose runtime takes no seed (``Stats.seeds_reproduce`` False: vLLM)."""

PLAN_TIMEOUT_S = 120.0
OLD_FEATURES = (
    "none: this engine predates rewrites; stop it, and the language server starts a current one when it next needs one"
)


def memory_plan(model: str | None, device: str) -> dict[str, object]:
    """``diffgemma-engine plan --json`` for ``model`` (the shipped one when None) on ``device``, in a subprocess
    (the doctor never imports torch): the weights per precision and the setting it recommends, or why not."""
    command = [sys.executable, "-m", "diffgemma_engine", "plan", "--json", "--device", device]
    if model:
        command += ["--model", model]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=PLAN_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {"error": f"no memory plan: {exc}"}
    if done.returncode != 0:
        return {"error": (done.stderr.strip().splitlines() or [f"plan exited with {done.returncode}"])[-1]}
    plan = json.loads(done.stdout)
    return {"weights_gib": plan["weights_gib"], "recommendation": plan["recommendation"], "devices": plan["devices"]}


def hub_cache(repo_id: str) -> str:
    """How far a pull of ``repo_id`` got: ``diffgemma-engine pull --check``, in a subprocess (the language server's
    side imports only ``diffgemma_engine.shared``), from the cache alone."""
    command = [sys.executable, "-m", "diffgemma_engine", "pull", "--check", repo_id]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=PLAN_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"no look at the hub cache: {exc}"
    lines = done.stdout.strip().splitlines() or done.stderr.strip().splitlines()
    return lines[-1] if lines else f"pull --check exited with {done.returncode}"


def step_ms_of(report: dict[str, object]) -> float:
    """Time per denoising step: the test completion's (the model's own canvas) when there is one, else the recent
    requests' median (0: none timed yet)."""
    probe = report.get("probe")
    if isinstance(probe, dict) and probe.get("steps"):
        return float(probe["denoise_ms"]) / int(probe["steps"])
    value = report.get("step_ms_p50", 0.0)
    return float(value) if isinstance(value, int | float) else 0.0


def pace_advice(step_ms: float, max_steps: int, min_steps: int, deadline_ms: int) -> str:
    """Whether completions keep up with typing at ``step_ms`` a step under ``deadline_ms``, and what to change when
    they do not (a deadline never cuts below ``min_steps``: a slow machine gets late completions, not noise)."""
    if step_ms <= 0 or max_steps <= 0:
        return "no completion timed yet (--probe times one)"
    floor_ms, whole_ms = step_ms * min_steps, step_ms * max_steps
    if deadline_ms and floor_ms > deadline_ms:
        return (
            f"completions cannot keep up with typing: the {min_steps} steps an answer needs take about "
            f"{floor_ms:.0f} ms, more than the deadline (deadlineMs {deadline_ms}), so each comes late. Use a GPU "
            "(doctor --plan shows what fits), a smaller canvas (canvasLength), or a smaller model; raise deadlineMs "
            "to say you will wait; fewer steps (the steps setting) are faster but answers fall apart below "
            f"{min_steps} (benchmarks/README.md)"
        )
    if deadline_ms and whole_ms > deadline_ms:
        fit = max(min_steps, int(deadline_ms // step_ms))
        return f"keeps up: the deadline cuts the schedule to about {fit} of {max_steps} steps (at least {min_steps})"
    return f"keeps up: the whole schedule ({max_steps} steps) takes about {whole_ms:.0f} ms"


def idle_exit_text(idle_exit_s: object) -> str:
    """The engine's idle exit, as doctor shows it."""
    if not isinstance(idle_exit_s, int | float) or idle_exit_s == 0:
        return "never"
    if idle_exit_s < 0:
        return "decided once the model has loaded (auto)"
    return f"after {idle_exit_s / 60:.0f} min without clients"


class LoadFailed(Exception):
    """The engine reported that its model failed to load."""


async def wait_for_load(reader: asyncio.StreamReader) -> None:
    """Wait (up to ``LOAD_WAIT_S``) for the engine to say ``Ready``, or raise ``LoadFailed`` with its reason."""
    try:
        while True:
            async with asyncio.timeout(LOAD_WAIT_S):
                message = await frames.read_message(reader)
            if isinstance(message, protocol.Ready):
                return
            if isinstance(message, protocol.Error) and message.code is protocol.ErrorCode.MODEL_ERROR:
                raise LoadFailed(message.message)
    except TimeoutError:
        return  # still loading: the stats say so


class _Conversation:
    """The doctor's messages to the engine on one connection, each with its answer."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    async def reply(self, request_id: str | None) -> protocol.Message:
        """The answer to ``request_id`` (the handshake's when None); a load failure the engine broadcasts on
        the way raises ``LoadFailed``, and a ``Ready`` is skipped."""
        while True:
            async with asyncio.timeout(TIMEOUT_S * 6):
                message = await frames.read_message(self.reader)
            if isinstance(message, protocol.Error) and message.id is None and request_id is not None:
                if message.code is protocol.ErrorCode.MODEL_ERROR:
                    raise LoadFailed(message.message)
                continue
            if isinstance(message, protocol.Ready):
                continue
            if request_id is None or getattr(message, "id", None) == request_id:
                return message

    async def ask(self, message: protocol.Message, request_id: str | None) -> protocol.Message:
        self.writer.write(frames.encode(message))
        await self.writer.drain()
        return await self.reply(request_id)


async def _examine(engine: _Conversation, report: dict[str, object], probe: bool) -> int:
    """Shake hands, ask for stats (and time one infill with ``probe``), writing what was found into ``report``;
    the status."""
    hello = await engine.ask(protocol.Hello(protocol=protocol.PROTOCOL_VERSION, client="doctor", pid=os.getpid()), None)
    if isinstance(hello, protocol.Error):
        report["problem"] = f"the engine refused the handshake: {hello.code.value}: {hello.message}"
        return 1
    assert isinstance(hello, protocol.HelloOk), hello
    report["layout"] = hello.layout.value
    report["features"] = hello.features
    if not hello.ready:
        await wait_for_load(engine.reader)
    stats = await engine.ask(protocol.GetStats(id="stats"), "stats")
    assert isinstance(stats, protocol.Stats), stats
    report.update(attrs.asdict(stats, recurse=False, filter=lambda attribute, _: attribute.name != "id"))
    report["connections"] = max(stats.connections - 1, 0)  # the engine counts this doctor's own connection
    report["compiled"] = str(stats.compiled)
    if not stats.ready:
        report["problem"] = "the model is still loading" if not stats.last_error else stats.last_error
        return 1
    if stats.runtime_state and stats.runtime_state != protocol.RUNTIME_HEALTHY:
        report["problem"] = f"vLLM, which runs the canvases: {stats.runtime_state}"
        return 1
    if probe:
        infill = protocol.Infill(id="probe", uri="doctor://probe", prefix="def add(a, b):\n", seed=0)
        result = await engine.ask(infill, "probe")
        if not isinstance(result, protocol.Result):
            report["problem"] = f"a test completion failed: {result}"
            return 1
        timings = result.timings
        report["probe"] = {"stop": result.stop.value, **attrs.asdict(timings), "total_ms": timings.total_ms}
    return 0


async def gather(socket_path: Path, probe: bool) -> tuple[dict[str, object], int]:
    """Connect, shake hands, ask for stats (and time one infill with ``probe``); returns (report, status)."""
    report: dict[str, object] = {"socket": str(socket_path)}
    try:
        async with asyncio.timeout(TIMEOUT_S):
            reader, writer = await socket_paths.open_engine(socket_path)
    except (OSError, TimeoutError) as exc:
        report["problem"] = f"no engine reachable on {socket_path}: {exc}"
        return report, 2
    try:
        return report, await _examine(_Conversation(reader, writer), report, probe)
    except LoadFailed as exc:
        report["problem"] = f"{exc} (the engine exits after a failed load)"
        return report, 1
    except (OSError, asyncio.IncompleteReadError, TimeoutError, frames.ProtocolError) as exc:
        report["problem"] = f"the engine stopped answering: {exc!r}"
        return report, 2
    finally:
        writer.close()


NONE_YET = "none yet (--probe times one)"


def _count(number: object, noun: str) -> str:
    return f"{number} {noun}" if number == 1 else f"{number} {noun}s"


def replies_text(replies: object) -> str:
    """The engine's replies by outcome (``{"eos": 3, "deadline": 1}``) as ``eos 3, deadline 1``."""
    if not isinstance(replies, dict) or not replies:
        return "none yet"
    return ", ".join(f"{outcome} {count}" for outcome, count in sorted(replies.items(), key=lambda item: -item[1]))


def latency_text(report: dict[str, object]) -> str:
    """The recent completions' p50 and p95, or none yet."""
    if not report.get("recent_count"):
        return NONE_YET
    return (
        f"p50 {report['recent_ms_p50']} ms, p95 {report['recent_ms_p95']} ms over "
        f"{_count(report['recent_count'], 'completion')}"
    )


def step_text(step_ms: float, min_steps: int, max_steps: int) -> str:
    """The time per denoising step and what a completion costs, or none yet."""
    if step_ms <= 0:
        return f"{NONE_YET}; a completion runs {min_steps} to {max_steps} steps"
    return (
        f"{step_ms:.1f} ms; a completion runs {min_steps} to {max_steps} steps: "
        f"{step_ms * min_steps:.0f} to {step_ms * max_steps:.0f} ms"
    )


def _strings(value: object) -> list[str]:
    """A report's list of strings (none when it has none)."""
    return [str(item) for item in value] if isinstance(value, list) else []


def model_text(model_id: object) -> str:
    """The served model as doctor shows it: the shipped one said to be a test model."""
    if model_id == socket_paths.SHIPPED_MODEL_ID:
        return (
            "default: the shipped test model (it tests the path; its completions are seldom right and it makes no "
            "next edits: see the README's first screen for a real model)"
        )
    return str(model_id or "(loading)")


def render(report: dict[str, object]) -> str:
    """A human-readable report."""
    lines = [f"engine socket   {report['socket']}"]
    if "model_id" in report:
        lines += [
            f"model           {model_text(report['model_id'])}",
            f"device          {report['device'] or '-'}",
            *([f"runtime state   {report['runtime_state']}"] if report.get("runtime_state") else []),
            *([] if report.get("seeds_reproduce", True) else [f"seeds           {NOT_REPRODUCIBLE}"]),
            *[f"runtime note    {note}" for note in _strings(report.get("runtime_notes"))],
            f"ready           {'yes' if report['ready'] else 'no'}",
            f"uptime          {report['uptime_s']} s, {_count(report['connections'], 'client')} besides this doctor, "
            f"{report['queued']} queued, {report.get('in_flight', 0)} in flight",
            f"memory          {report['rss_mb']} MiB resident",
            f"denoising step  {report.get('compiled') or '-'}",
            f"replies         {replies_text(report['replies'])}",
            f"recent latency  {latency_text(report)}",
            f"last error      {report['last_error'] or 'none'}",
            f"idle exit       {idle_exit_text(report.get('idle_exit_s'))}",
        ]
        max_steps, min_steps = report.get("max_steps"), report.get("min_steps")
        if "pace" in report and isinstance(max_steps, int) and isinstance(min_steps, int):
            lines += [
                f"time per step   {step_text(step_ms_of(report), min_steps, max_steps)}",
                f"keeping up      {report['pace']}",
            ]
    if "features" in report:
        features = report["features"]
        assert isinstance(features, list)
        lines.append(f"features        {', '.join(features) or OLD_FEATURES}")
    if "plan" in report:
        plan = report["plan"]
        assert isinstance(plan, dict)
        if "error" in plan:
            lines.append(f"memory plan     {plan['error']}")
        else:
            sizes = ", ".join(f"{name} {size_text(gib * GIB)}" for name, gib in plan["weights_gib"].items())
            chosen = plan["recommendation"]
            use = f"use {chosen['setting']} ({chosen['precision']})" if chosen else "nothing fits: add cpu or disk"
            lines.append(f"memory plan     weights {sizes}; {use}")
    if "hub_cache" in report:
        lines.append(f"hub cache       {report['hub_cache']}")
    if "probe" in report:
        probe = report["probe"]
        assert isinstance(probe, dict)
        steps = probe["steps"] or "an unknown number of"  # 0: vLLM does not say
        lines.append(
            f"test completion {probe['stop']}: {probe['total_ms']:.0f} ms, {steps} steps, {probe['new_tokens']} tokens"
        )
    lines.append(f"status          {'PROBLEM: ' + str(report['problem']) if 'problem' in report else 'ok'}")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    """The command line of ``diffgemma-lsp doctor``."""
    parser = argparse.ArgumentParser(prog="diffgemma-lsp doctor", description=__doc__.splitlines()[0])
    parser.add_argument("--engine-socket", type=Path, default=None, help="the engine to check")
    parser.add_argument("--model", default=None, help="check the engine that serves this model (the model setting)")
    parser.add_argument("--device", default="auto", help="... on this device (the device setting)")
    parser.add_argument("--quantization", default="", help="... with this quantization (the quantization setting)")
    parser.add_argument("--probe", action="store_true", help="also time one test completion")
    parser.add_argument(
        "--deadline-ms",
        type=int,
        default=Settings().deadline_ms,
        help="the deadlineMs setting, to say whether completions keep up with it",
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument(
        "--plan", action="store_true", help="also show the model's memory plan (always shown when its load failed)"
    )
    return parser


def main(argv: list[str]) -> int:
    """``diffgemma-lsp doctor``: the report, and its status as the exit status."""
    args = build_parser().parse_args(argv)
    socket_path = args.engine_socket or socket_paths.socket_path_for(args.model, args.device, args.quantization)
    report, status = asyncio.run(gather(socket_path.expanduser(), args.probe))
    if report.get("ready"):
        max_steps, min_steps = report.get("max_steps"), report.get("min_steps")
        if isinstance(max_steps, int) and isinstance(min_steps, int):
            report["pace"] = pace_advice(step_ms_of(report), max_steps, min_steps, args.deadline_ms)
    served = report.get("model_id")
    model = args.model or (
        served if isinstance(served, str) and served not in ("", socket_paths.SHIPPED_MODEL_ID) else None
    )
    failed_load = "failed to load" in str(report.get("problem", ""))
    if args.plan or (failed_load and model is not None):
        report["plan"] = memory_plan(model, args.device)
    if args.model and socket_paths.is_hub_id(args.model):
        report["hub_cache"] = hub_cache(args.model)
    print(json.dumps(report, indent=2) if args.json else render(report))
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
