"""``diffgemma-lsp doctor`` says how long a step and a completion take on this machine and what to change when
completions cannot keep up with typing; the engine's idle exit follows what reloading its model costs, and is a
setting."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest

from diffgemma_engine.service.idle import QUICK_IDLE_S, SLOW_IDLE_S, idle_exit_after, parse_idle_exit
from diffgemma_lsp.backends.connect import EngineSettings, engine_command
from diffgemma_lsp.doctor import pace_advice
from diffgemma_lsp.settings import parse_settings
from tests.support.engine import EngineProcess, RawClient


def _doctor(socket_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "diffgemma_lsp", "doctor", "--engine-socket", str(socket_path), *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_advice_for_a_cpu_box_running_the_release() -> None:
    """The README's CPU box: 631 ms a release step (computed floor), 48 steps, at least 24 under a deadline."""
    advice = pace_advice(631.3, 48, 24, deadline_ms=2000)
    assert advice.startswith("completions cannot keep up with typing: the 24 steps an answer needs take about 15151")
    assert "GPU" in advice and "canvasLength" in advice and "deadlineMs" in advice
    assert pace_advice(15.1, 48, 24, deadline_ms=2000).startswith("keeps up: the whole schedule (48 steps)")
    cut = pace_advice(60.0, 48, 24, deadline_ms=2000)
    assert cut.startswith("keeps up: the deadline cuts the schedule to about 33 of 48")
    assert pace_advice(0.0, 48, 24, deadline_ms=2000).startswith("no completion timed yet")


async def test_doctor_shows_the_time_per_step_and_what_to_change(short_tmp: Path, random_model_dir: Path) -> None:
    engine = EngineProcess(
        random_model_dir, short_tmp / "run" / "engine.sock", short_tmp / "engine.log", ["--idle-exit", "auto"]
    )
    try:
        await (await RawClient.connect(engine.socket_path)).close()  # wait for the model
        out = await asyncio.to_thread(_doctor, engine.socket_path, "--probe", "--json", "--deadline-ms", "1")
        assert out.returncode == 0, out.stdout + out.stderr
        report = json.loads(out.stdout)
        assert (report["max_steps"], report["min_steps"]) == (8, 4)  # the checkpoint's schedule, half of it
        assert report["probe"]["steps"] >= 4  # the floor, although a 1 ms deadline affords none
        assert report["pace"].startswith("completions cannot keep up with typing")
        assert report["idle_exit_s"] == idle_exit_after(report["load_ms"])  # auto, decided from the load time
        # No probe: the time per step is the recent requests' (the probe above among them).
        human = await asyncio.to_thread(_doctor, engine.socket_path, "--deadline-ms", "600000")
        assert human.returncode == 0, human.stdout
        lines = {line[:16].strip(): line[16:] for line in human.stdout.splitlines()}
        assert lines["time per step"].endswith(" ms") and "a completion runs 4 to 8 steps" in lines["time per step"]
        assert lines["keeping up"].startswith("keeps up")
        assert lines["idle exit"] == f"after {report['idle_exit_s'] / 60:.0f} min without clients"
    finally:
        engine.stop()


def test_auto_idle_exit_follows_the_load_time() -> None:
    assert idle_exit_after(1_000) == QUICK_IDLE_S == 15 * 60
    assert idle_exit_after(180_000) == SLOW_IDLE_S >= 3600  # the release: minutes to load, hours kept
    assert parse_idle_exit("auto") is None and parse_idle_exit("0") == 0.0 and parse_idle_exit("90") == 90.0


@pytest.mark.parametrize("bad", ["-1", "nan", "soon"])
def test_a_bad_idle_exit_is_refused_by_the_command_line(bad: str, short_tmp: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "diffgemma_engine", "serve", "--socket", str(short_tmp / "e.sock"), "--idle-exit", bad],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2 and "--idle-exit" in done.stderr, done.stderr


def test_the_idle_exit_setting_reaches_the_engines_command_line(tmp_path: Path) -> None:
    def idle_exit(raw: object) -> str:
        settings, problems = parse_settings({"engineIdleExitMinutes": raw})
        assert problems == []
        command = engine_command(tmp_path / "e.sock", EngineSettings.of(settings))
        return command[command.index("--idle-exit") + 1]

    assert idle_exit(None) == "auto"  # the default: by what reloading costs
    assert idle_exit(0) == "0"  # never
    assert idle_exit(30) == "1800"
    settings, problems = parse_settings({"engineIdleExitMinutes": -5})
    assert settings.engine_idle_exit_minutes is None and "engineIdleExitMinutes" in problems[0]
    assert parse_settings({"engineIdleExitMinutes": "soon"})[1]


def test_doctor_says_the_shipped_model_is_a_test_model() -> None:
    """A newcomer reads ``model default`` and cannot know that it is the small model that only tests the path."""
    from diffgemma_engine.shared.socket_paths import SHIPPED_MODEL_ID
    from diffgemma_lsp.doctor import model_text

    assert model_text(SHIPPED_MODEL_ID).startswith("default: the shipped test model (it tests the path;")
    assert model_text("google/diffusiongemma-26B-A4B-it") == "google/diffusiongemma-26B-A4B-it"
    assert model_text("") == "(loading)"
