"""``serve --step captured``: the capturable step compiled per serving shape in the background, serving the
canvases it covers with the eager exact loop's answers, and leaving every other canvas to the eager loop."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from diffgemma_engine.canvas.captured import CapturedLoop, serving_shapes
from diffgemma_engine.loading.model import LoadedModel, load_model
from diffgemma_engine.request.infill import run_infill
from diffgemma_engine.shared import protocol
from tests.support.engine import EngineProcess, RawClient
from tests.support.models import MEMORIZED_MIDDLE, MEMORIZED_PREFIX, MEMORIZED_SUFFIX

PREFIX = "def total(numbers):\n    result = 0\n    for n in numbers:\n        "


def test_the_serving_shapes_are_each_canvas_in_each_prompt_bucket() -> None:
    assert serving_shapes([32, 16], 384) == [(1, 16, 256), (1, 16, 512), (1, 32, 256), (1, 32, 512)]
    assert serving_shapes([32, 32], 1024) == [(1, 32, 256), (1, 32, 512), (1, 32, 1024)]
    assert serving_shapes([32], 100) == [(1, 32, 256)]


@pytest.fixture(scope="module")
def captured() -> LoadedModel:
    """The shipped model with one shape captured (the model's canvas, prompts up to 256 tokens): compiled with
    the default mode on a CPU, where there are no CUDA graphs to record."""
    loaded = load_model(None)
    loaded.serving.loop = CapturedLoop(loaded.model, loaded.sampler, [(1, loaded.canvas_length, 256)], mode="default")
    assert loaded.serving.loop.state == "warming" and loaded.info().compile_state() == "loop warming"
    loaded.serving.loop.start()
    assert loaded.serving.loop.wait(timeout=600), "warming did not end"
    assert loaded.serving.loop.state == "captured", loaded.serving.loop.state
    return loaded


def _answer(loaded: LoadedModel, seed: int, **fields: object) -> tuple[str, protocol.Timings]:
    request = protocol.Infill(id=str(seed), uri="file:///t.py", prefix=PREFIX, seed=seed, **fields)  # type: ignore[arg-type]
    text, _, timings = run_infill(loaded, request)
    return text, timings


def test_a_captured_canvas_answers_as_the_eager_exact_loop(captured: LoadedModel) -> None:
    assert captured.serving.loop is not None and captured.info().compile_state() == "loop captured"
    assert captured.serving.loop.serves(1, captured.canvas_length, 40, captured.sampler)
    # a copy serves with a serving state of its own (no captured loop): the eager exact loop
    eager = dataclasses.replace(captured, sampler=dataclasses.replace(captured.sampler, exact=True))
    served = captured.serving.loop.served
    for seed in range(3):
        graph_text, graph_timings = _answer(captured, seed)
        eager_text, eager_timings = _answer(eager, seed)
        assert graph_text == eager_text and graph_timings.steps == eager_timings.steps, seed
    assert captured.serving.loop.served == served + 3  # on the graph, not the eager loop


def test_other_canvases_are_left_to_the_eager_loop(captured: LoadedModel) -> None:
    loop = captured.serving.loop
    assert loop is not None
    line = captured.line_canvas_length or captured.canvas_length // 2
    assert not loop.serves(1, line, 40, captured.sampler)  # a shape not warmed: it would compile on this thread
    assert not loop.serves(1, captured.canvas_length, 300, captured.sampler)  # the 512 bucket was not warmed
    assert not loop.serves(2, captured.canvas_length, 40, captured.sampler)
    assert not loop.serves(1, captured.canvas_length, 40, dataclasses.replace(captured.sampler, t_min=0.1))
    assert loop.serves(1, captured.canvas_length, 40, dataclasses.replace(captured.sampler, max_steps=5))
    served = loop.served
    text, timings = _answer(captured, 0, scope=protocol.Scope.LINE)  # the line canvas: eager, and answered
    assert timings.steps > 0 and isinstance(text, str) and loop.served == served


def test_a_failed_capture_keeps_the_eager_loop_serving(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_compiler(*args: object, **kwargs: object) -> object:
        raise RuntimeError("no C++ compiler found")

    monkeypatch.setattr(torch, "compile", no_compiler)
    loaded = load_model(None)
    loaded.serving.loop = CapturedLoop(loaded.model, loaded.sampler, [(1, loaded.canvas_length, 256)])
    loaded.serving.loop.start()
    assert loaded.serving.loop.wait(60)
    assert loaded.serving.loop.state == "failed: RuntimeError: no C++ compiler found"
    assert not loaded.serving.loop.serves(1, loaded.canvas_length, 40, loaded.sampler)
    text, timings = _answer(loaded, 0)
    assert timings.steps > 0 and loaded.serving.loop.served == 0 and text == _answer(load_model(None), 0)[0]


async def test_the_engine_captures_in_the_background_and_says_so(memorized_model_dir: Path, short_tmp: Path) -> None:
    """``serve --step captured``: the loop's state in the stats, and completions answered while it warms."""
    engine = EngineProcess(memorized_model_dir, short_tmp / "e.sock", short_tmp / "e.log", ["--step", "captured"])
    try:
        client = await RawClient.connect(engine.socket_path)
        await client.send(protocol.GetStats(id="s"))
        stats = await client.receive()
        assert isinstance(stats, protocol.Stats) and str(stats.compiled) in ("loop warming", "loop captured"), stats
        request = protocol.Infill(id="t", uri="file:///t.py", prefix=MEMORIZED_PREFIX, suffix=MEMORIZED_SUFFIX, seed=0)
        await client.send(request)
        answer = await client.receive()
        assert isinstance(answer, protocol.Result) and answer.text == MEMORIZED_MIDDLE
        await client.close()
    finally:
        engine.stop()
