"""A deadline never cuts a completion below the steps its answer needs to mean something: the budget keeps the
model's floor (``min_steps``), the deadline does not stop the loop before the floor has run, and a checkpoint can set
its own floor in ``diffgemma.json``. The answer comes later, not worse."""

from __future__ import annotations

import json
import shutil
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from diffgemma_engine.canvas.clock import StepClock, default_min_steps, floor_for, hold_deadline
from diffgemma_engine.errors import ModelLoadError
from diffgemma_engine.loading.model import load_model
from diffgemma_engine.shared import protocol
from tests.support.engine import EngineProcess, RawClient


def test_the_default_floor_is_half_the_schedule() -> None:
    assert [default_min_steps(steps) for steps in (1, 8, 16, 48)] == [1, 4, 8, 24]


def test_a_shorter_schedule_keeps_the_same_share_as_its_floor() -> None:
    assert floor_for(48, min_steps=24, model_steps=48) == 24
    assert floor_for(8, min_steps=8, model_steps=16) == 4  # the line canvas: half the canvas, half the steps
    assert floor_for(3, min_steps=24, model_steps=48) == 2
    assert floor_for(2, min_steps=48, model_steps=48) == 2  # never more than the schedule asked for


def test_a_budget_too_short_for_the_floor_is_the_floor() -> None:
    clock = StepClock()
    clock.observe(256, encode_ms=100, denoise_ms=6310, steps=10)  # 631 ms a step: the CPU box's release step
    assert clock.step_budget(256, 48, time_left_ms=2000, min_steps=24) == 24
    assert clock.step_budget(256, 48, time_left_ms=60_000, min_steps=24) == 48
    assert clock.step_budget(256, 16, time_left_ms=2000, min_steps=24) == 16  # a floor above the schedule


def test_a_deadline_is_held_until_the_floor_has_run_and_a_cancel_is_not() -> None:
    reasons = iter(["deadline"] * 5)
    check = hold_deadline(lambda: next(reasons), 3)
    assert [check() for _ in range(5)] == [None, None, None, "deadline", "deadline"]
    cancel = hold_deadline(lambda: "cancelled", 3)
    assert cancel() == "cancelled"


@pytest.fixture
def random_engine(random_model_dir: Path, short_tmp: Path) -> Iterator[EngineProcess]:
    """The random-weight checkpoint: its canvases never settle, so only the schedule, the floor and the deadline
    decide how many steps run."""
    engine = EngineProcess(random_model_dir, short_tmp / "run" / "engine.sock", short_tmp / "engine.log")
    yield engine
    engine.stop()


@pytest.fixture
async def client(random_engine: EngineProcess) -> AsyncIterator[RawClient]:
    connection = await RawClient.connect(random_engine.socket_path)
    yield connection
    await connection.close()


async def test_a_deadline_that_cannot_afford_the_floor_still_runs_it(client: RawClient, random_model_dir: Path) -> None:
    """A 1 ms deadline is past before the first step: the first request (no estimate yet) and the next (whose
    budget the estimate turns into 1 step) both run the floor, then stop for the deadline."""
    schedule = json.loads((random_model_dir / "generation_config.json").read_text())["max_denoising_steps"]
    floor = default_min_steps(schedule)
    assert 1 < floor < schedule
    for request_id in ("first", "estimated"):
        await client.send(protocol.Infill(id=request_id, uri="file:///a.py", prefix="def f(x):\n", deadline_ms=1))
        result = await client.receive()
        assert isinstance(result, protocol.Result), result
        assert result.timings.steps >= floor, (request_id, result)
        assert result.stop in (protocol.StopReason.DEADLINE, protocol.StopReason.LENGTH, protocol.StopReason.EOS)


async def test_a_batch_row_runs_the_floor_under_a_deadline_too(client: RawClient, random_model_dir: Path) -> None:
    """Candidates are one batch (``diffgemma_engine.request.batch``): each row's deadline is held as a single request's
    is."""
    schedule = json.loads((random_model_dir / "generation_config.json").read_text())["max_denoising_steps"]
    await client.send(protocol.Infill(id="rows", uri="file:///a.py", prefix="def f(x):\n", deadline_ms=1, candidates=2))
    result = await client.receive()
    assert isinstance(result, protocol.Result), result
    assert result.timings.steps >= default_min_steps(schedule), result


def test_a_checkpoint_sets_its_own_floor(tmp_path: Path, random_model_dir: Path) -> None:
    folder = tmp_path / "model"
    shutil.copytree(random_model_dir, folder)
    (folder / "diffgemma.json").write_text(json.dumps({"min_steps": 6}))
    loaded = load_model(folder)
    assert loaded.sampler.max_steps == 8 and loaded.min_steps == 6
    assert loaded.step_floor(8) == 6 and loaded.step_floor(4) == 3
    assert loaded.info().min_steps == 6


def test_a_floor_out_of_range_is_refused_at_load_naming_it(tmp_path: Path, random_model_dir: Path) -> None:
    folder = tmp_path / "model"
    shutil.copytree(random_model_dir, folder)
    (folder / "diffgemma.json").write_text(json.dumps({"min_steps": 0}))
    with pytest.raises(ModelLoadError, match="min_steps must be a whole number from 1"):
        load_model(folder)
