"""The model thread: the only thread that touches torch. Loads the model, then serves jobs one by one."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path

import attrs
import torch

from engine import protocol
from engine.batch import MAX_BATCH, compatible, run_batch
from engine.errors import EngineError
from engine.infill import check_request, prompt_ids, run_infill
from engine.jobs import Job, JobQueue
from engine.model import LoadedModel, load_model

logger = logging.getLogger(__name__)

MIN_CANVAS = 8
"""Out of memory, a request's canvas is halved down to this many tokens before giving up."""


class ModelWorker(threading.Thread):
    """Owns the model. ``on_loaded`` / ``on_failed`` are called from this thread once loading ends."""

    def __init__(
        self,
        queue: JobQueue,
        model_dir: Path | None,
        device: str | None,
        dtype: str | None,
        on_loaded: Callable[[LoadedModel], None],
        on_failed: Callable[[BaseException], None],
        threads: int | None = None,
        max_batch: int = MAX_BATCH,
        compile_step: bool = False,
        max_memory: str | None = None,
    ) -> None:
        super().__init__(name="diffgemma-model", daemon=True)
        self.queue = queue
        self.model_dir = model_dir
        self.device = device
        self.dtype = dtype
        self.max_memory = max_memory
        self.on_loaded = on_loaded
        self.on_failed = on_failed
        self.threads = threads
        self.max_batch = max_batch
        self.compile_step = compile_step
        self.loaded: LoadedModel | None = None

    def run(self) -> None:
        """Load, warm up, then serve until the queue is closed."""
        if self.threads:
            torch.set_num_threads(self.threads)
        try:
            self.loaded = load_model(self.model_dir, self.device, self.dtype, max_memory=self.max_memory)
            self._warm_up(self.loaded)
        except BaseException as exc:  # noqa: BLE001 - reported to every client, then the engine exits
            logger.exception("model load failed")
            self.on_failed(exc)
            return
        self.on_loaded(self.loaded)
        if self.compile_step:
            self.loaded.step.start_compiling()  # in the background: requests are served eagerly until it is done
        while (job := self.queue.take()) is not None:
            batch = self._batch_for(self.loaded, job)
            if len(batch) > 1:
                self._serve_batch(self.loaded, batch)
            else:
                self._serve(self.loaded, job)

    def _batch_for(self, loaded: LoadedModel, job: Job) -> list[Job]:
        """``job`` and the queued jobs that can share its decoder passes (up to ``max_batch``)."""
        if self.max_batch <= 1 or job.cancel_reason is not None or loaded.prefix_cache is None:
            return [job]
        return [job, *self.queue.take_matching(lambda other: compatible(job, other, loaded), self.max_batch - 1)]

    def _serve_batch(self, loaded: LoadedModel, jobs: list[Job]) -> None:
        started = time.monotonic()
        for job in jobs:
            job.started = started
        try:
            results = run_batch(loaded, jobs)
        except Exception:  # noqa: BLE001 - one at a time instead, where a failure stays with its request
            logger.exception("a batch of %d failed; serving its requests one by one", len(jobs))
            for job in jobs:
                self._serve(loaded, job)
            return
        for job, (text, stop, timings) in zip(jobs, results, strict=True):
            logger.info(
                "request %s (batch of %d): %s, %d steps, %d tokens, encode %.1f ms, denoise %.1f ms",
                job.request.id,
                len(jobs),
                stop.value,
                timings.steps,
                timings.new_tokens,
                timings.encode_ms,
                timings.denoise_ms,
            )
            job.resolve_threadsafe(self._result(job, text, stop, timings))

    def _warm_up(self, loaded: LoadedModel) -> None:
        """One short canvas so the first user request does not pay for lazy initialisation."""
        request = protocol.Infill(id="warm-up", uri="", prefix="def f():\n", max_steps=2)
        run_infill(loaded, request)

    def _serve(self, loaded: LoadedModel, job: Job) -> None:
        job.started = time.monotonic()
        request = job.request
        if job.cancel_reason is not None:
            job.resolve_threadsafe(self._result(job, "", job.cancel_reason, protocol.Timings()))
            return
        try:
            if request.candidates > 1:
                text, stop, timings, alternatives = self._run_candidates(loaded, job)
            else:
                text, stop, timings = self._run_with_memory_fallback(loaded, request, job)
                alternatives = []
        except EngineError as exc:
            logger.warning("request %s refused: %s", request.id, exc)
            job.resolve_threadsafe(exc.to_wire(request.id))
            return
        except torch.OutOfMemoryError as exc:
            logger.error("request %s: out of memory: %s", request.id, exc)
            job.resolve_threadsafe(
                protocol.Error(code=protocol.ErrorCode.MODEL_ERROR, message=f"out of memory: {exc}", id=request.id)
            )
            return
        except Exception as exc:  # noqa: BLE001 - one request's failure must not stop the engine
            logger.exception("request %s failed", request.id)
            job.resolve_threadsafe(
                protocol.Error(code=protocol.ErrorCode.INTERNAL, message=f"{type(exc).__name__}: {exc}", id=request.id)
            )
            return
        logger.info(
            "request %s: %s, %d steps, %d tokens, encode %.1f ms, denoise %.1f ms%s",
            request.id,
            stop.value,
            timings.steps,
            timings.new_tokens,
            timings.encode_ms,
            timings.denoise_ms,
            f" ({request.candidates} candidates, {1 + len(alternatives)} distinct)" if request.candidates > 1 else "",
        )
        job.resolve_threadsafe(self._result(job, text, stop, timings, alternatives))

    @staticmethod
    def _run_candidates(loaded: LoadedModel, job: Job) -> tuple[str, protocol.StopReason, protocol.Timings, list[str]]:
        """``candidates`` canvases for one prompt in one batch: the first row's answer and the other distinct ones."""
        rows = run_batch(loaded, [job] * job.request.candidates)
        text, stop, timings = rows[0]
        alternatives: list[str] = []
        for other, _, _ in rows[1:]:
            if other and other != text and other not in alternatives:
                alternatives.append(other)
        return text, stop, timings, alternatives

    @staticmethod
    def _run_with_memory_fallback(
        loaded: LoadedModel, request: protocol.Infill, job: Job
    ) -> tuple[str, protocol.StopReason, protocol.Timings]:
        """Run the request; out of memory, retry with half the canvas down to ``MIN_CANVAS``."""
        while True:
            try:
                deadline = job.deadline
                time_left_ms = (deadline - time.monotonic()) * 1000.0 if deadline is not None else None
                return run_infill(loaded, request, job.should_stop, cache_key=job.key, time_left_ms=time_left_ms)
            except torch.OutOfMemoryError:
                canvas, _ = check_request(loaded, request)
                if canvas <= MIN_CANVAS:
                    raise
                if loaded.device.type == "cuda":
                    torch.cuda.empty_cache()
                smaller = max(MIN_CANVAS, canvas // 2)
                logger.warning("request %s: out of memory at canvas %d; retrying at %d", request.id, canvas, smaller)
                request = attrs.evolve(request, canvas_length=smaller)

    def _result(
        self,
        job: Job,
        text: str,
        stop: protocol.StopReason,
        timings: protocol.Timings,
        alternatives: list[str] | None = None,
    ) -> protocol.Result:
        timings = attrs.evolve(timings, queue_ms=round(job.queue_ms(), 3))
        prompt = ""
        if job.request.echo and self.loaded is not None:  # laid out again: a millisecond, and only when asked
            prompt = self.loaded.decode_prompt(prompt_ids(self.loaded, job.request))
        return protocol.Result(
            id=job.request.id, text=text, stop=stop, timings=timings, alternatives=alternatives or [], prompt=prompt
        )
