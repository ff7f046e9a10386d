"""The model thread under faults: one request's exception or out-of-memory does not stop the engine."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest
import torch

from diffgemma_engine.runtimes import own_loop as worker_module
from diffgemma_engine.runtimes.own_loop import OwnLoop
from diffgemma_engine.service.jobs import Job, JobQueue
from diffgemma_engine.service.worker import ModelWorker
from diffgemma_engine.shared import protocol
from tests.support.models import MEMORIZED_MIDDLE, MEMORIZED_PREFIX, MEMORIZED_SUFFIX


async def _serve(model_dir: Path, requests: list[protocol.Infill]) -> list[protocol.Result | protocol.Error]:
    """Run a real ModelWorker thread over ``requests``; return the replies in order."""
    loop = asyncio.get_running_loop()
    queue = JobQueue()
    loaded = asyncio.Event()
    worker = ModelWorker(
        queue,
        OwnLoop(model_dir, "cpu", None),
        on_loaded=lambda _: loop.call_soon_threadsafe(loaded.set),
        on_failed=lambda error: loop.call_soon_threadsafe(pytest.fail, f"load failed: {error}"),
    )
    worker.start()
    await asyncio.wait_for(loaded.wait(), 120)
    jobs = [Job(request=r, key=(1, r.uri), loop=loop, future=loop.create_future()) for r in requests]
    for job in jobs:
        queue.submit(job)
    replies = [await asyncio.wait_for(job.future, 60) for job in jobs]
    queue.close()
    worker.join(10)
    return replies


def _request(request_id: str, **overrides: object) -> protocol.Infill:
    fields: dict[str, object] = dict(
        id=request_id, uri=f"file:///{request_id}.py", prefix=MEMORIZED_PREFIX, suffix=MEMORIZED_SUFFIX, seed=0
    )
    fields.update(overrides)
    return protocol.Infill(**fields)  # type: ignore[arg-type]


async def test_an_exception_fails_only_its_own_request(
    memorized_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = worker_module.run_infill

    def explode_on_boom(loaded, request, should_stop=None, **kwargs):
        if request.id == "boom":
            raise RuntimeError("something broke inside the model")
        return real(loaded, request, should_stop, **kwargs)

    monkeypatch.setattr(worker_module, "run_infill", explode_on_boom)
    before, boom, after = await _serve(memorized_model_dir, [_request("before"), _request("boom"), _request("after")])
    assert isinstance(boom, protocol.Error) and boom.id == "boom"
    assert boom.code is protocol.ErrorCode.INTERNAL and "something broke" in boom.message
    assert isinstance(before, protocol.Result) and before.text == MEMORIZED_MIDDLE
    assert isinstance(after, protocol.Result) and after.text == MEMORIZED_MIDDLE
    print("faults survived: 1 exception; requests answered: 3; lost: 0")


async def test_out_of_memory_halves_a_canvas_longer_than_the_models_own_down_to_it(
    memorized_model_dir: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    real = worker_module.run_infill
    canvases: list[int] = []

    def oom_above_32(loaded, request, should_stop=None, **kwargs):
        if request.id == "warm-up":
            return real(loaded, request, should_stop, **kwargs)
        canvases.append(request.canvas_length or loaded.canvas_length)
        if canvases[-1] > 32:
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
        return real(loaded, request, should_stop, **kwargs)

    monkeypatch.setattr(worker_module, "run_infill", oom_above_32)
    with caplog.at_level(logging.WARNING, logger="diffgemma_engine.runtimes.own_loop"):
        (reply,) = await _serve(memorized_model_dir, [_request("big", canvas_length=128)])
    assert isinstance(reply, protocol.Result) and reply.text == MEMORIZED_MIDDLE
    assert canvases == [128, 64, 32]  # the model's own canvas is 32: never below it
    assert "out of memory at canvas 128; retrying at 64" in caplog.text


async def test_out_of_memory_at_the_models_own_canvas_is_an_error_that_says_so(
    memorized_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = worker_module.run_infill
    canvases: list[int] = []

    def oom_for_request_oom(loaded, request, should_stop=None, **kwargs):
        if request.id == "oom":
            canvases.append(request.canvas_length or loaded.canvas_length)
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
        return real(loaded, request, should_stop, **kwargs)

    monkeypatch.setattr(worker_module, "run_infill", oom_for_request_oom)
    oom, ok = await _serve(memorized_model_dir, [_request("oom"), _request("ok")])
    assert isinstance(oom, protocol.Error) and oom.code is protocol.ErrorCode.MODEL_ERROR
    assert "out of memory" in oom.message and "the model's own is 32" in oom.message
    assert canvases == [32]  # not 16, 8: a shorter canvas than it was trained on would change what it writes
    assert isinstance(ok, protocol.Result) and ok.text == MEMORIZED_MIDDLE


async def test_out_of_memory_drops_other_documents_cached_prompts_first(
    memorized_model_dir: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    real = worker_module.run_infill
    failed: list[str] = []

    def oom_once_for_second(loaded, request, should_stop=None, **kwargs):
        if request.id == "second" and not failed:
            failed.append(request.id)
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
        return real(loaded, request, should_stop, **kwargs)

    monkeypatch.setattr(worker_module, "run_infill", oom_once_for_second)
    with caplog.at_level(logging.WARNING, logger="diffgemma_engine.runtimes.own_loop"):
        first, second = await _serve(memorized_model_dir, [_request("first"), _request("second")])
    assert isinstance(first, protocol.Result) and isinstance(second, protocol.Result)
    assert second.text == MEMORIZED_MIDDLE
    assert "out of memory at canvas 32; dropped 1 cached prompts, retrying" in caplog.text


async def test_out_of_memory_with_candidates_sheds_candidates_not_canvas(
    memorized_model_dir: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    real = worker_module.run_batch
    rows_tried: list[int] = []

    def oom_above_two_rows(loaded, jobs):
        rows_tried.append(len(jobs))
        if len(jobs) > 2:
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
        return real(loaded, jobs)

    monkeypatch.setattr(worker_module, "run_batch", oom_above_two_rows)
    with caplog.at_level(logging.WARNING, logger="diffgemma_engine.runtimes.own_loop"):
        (reply,) = await _serve(memorized_model_dir, [_request("several", candidates=4)])
    assert isinstance(reply, protocol.Result) and reply.text == MEMORIZED_MIDDLE
    assert rows_tried == [4, 2]
    assert "out of memory with 4 candidates; trying 2" in caplog.text
