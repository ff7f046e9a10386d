"""The model thread: the only thread that touches torch. Starts the runtime that runs the canvases
(``diffgemma_engine.runtimes``: the engine's own loop, or vLLM), then serves jobs one by one, or together where the
runtime can run them together. It does not ask which runtime it has."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import attrs
import torch

from ..errors import EngineError, describe
from ..loading.model import LoadedModel
from ..loading.model_info import ModelInfo
from ..request.infill import Answer, prompt_ids
from ..runtimes.seam import CanvasRuntime, RowsDidNotFit
from ..shared import protocol
from .jobs import Job, JobQueue

logger = logging.getLogger(__name__)


class ModelWorker(threading.Thread):
    """Owns the runtime. ``on_loaded`` (with the socket side's ``ModelInfo``) / ``on_failed`` are called from this
    thread once it has started or failed to."""

    def __init__(
        self,
        queue: JobQueue,
        runtime: CanvasRuntime,
        on_loaded: Callable[[ModelInfo], object],
        on_failed: Callable[[BaseException], object],
        threads: int | None = None,
    ) -> None:
        super().__init__(name="diffgemma-model", daemon=True)
        self.queue = queue
        self.runtime = runtime
        """What runs the canvases (``diffgemma_engine.runtimes.seam.CanvasRuntime``)."""
        self.on_loaded = on_loaded
        self.on_failed = on_failed
        self.threads = threads
        self.loaded: LoadedModel | None = None
        """The checkpoint's facts, once the runtime has started (for echoing a request's prompt)."""

    def run(self) -> None:
        """Start the runtime, then serve until the queue is closed."""
        if self.threads:
            torch.set_num_threads(self.threads)
        try:
            self.loaded = self.runtime.start()
        except BaseException as exc:
            logger.exception("model load failed")
            self.on_failed(exc)
            return
        self.on_loaded(self.runtime.info())
        while (job := self.queue.take()) is not None:
            batch = self._batch_for(job)
            if len(batch) > 1:
                self._serve_batch(batch)
            else:
                self._serve(job)

    def _batch_for(self, job: Job) -> list[Job]:
        """``job`` and the queued jobs that can run together with it (as many as the runtime takes)."""
        rows = self.runtime.rows_together()
        if rows <= 1 or job.cancel_reason is not None:
            return [job]
        return [job, *self.queue.take_matching(lambda other: self._joins(job, other), rows - 1)]

    def _joins(self, job: Job, other: Job) -> bool:
        """Whether the queued ``other`` can run with ``job`` (not if it is already cancelled)."""
        return other.cancel_reason is None and self.runtime.joins(job.request, other.request)

    def _serve_batch(self, jobs: list[Job]) -> None:
        started = time.monotonic()
        for job in jobs:
            job.started = started
        try:
            results = self.runtime.run_together(jobs)
        except RowsDidNotFit:  # said by the runtime
            results = None
        except Exception:
            logger.exception("a batch of %d failed; serving its requests one by one", len(jobs))
            results = None
        if results is None:
            for job in jobs:
                self._serve(job)
            return
        for job, answer in zip(jobs, results, strict=True):
            stop, timings = answer.stop, answer.timings
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
            job.resolve_threadsafe(self._result(job, answer))

    def _serve(self, job: Job) -> None:
        job.started = time.monotonic()
        request = job.request
        if job.cancel_reason is not None:
            job.resolve_threadsafe(self._result(job, Answer("", job.cancel_reason, protocol.Timings())))
            return
        windows: list[protocol.WindowResult] = []
        try:
            if request.windows:  # more places of the document: all run together
                (answer, alternatives), *others = self.runtime.run_windows(job)
                windows = [
                    protocol.WindowResult(text=one.text, stop=one.stop, alternatives=[o.text for o in more])
                    for one, more in others
                ]
            else:
                answer, alternatives = self.runtime.run(job)
            stop, timings = answer.stop, answer.timings
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
        except Exception as exc:
            logger.exception("request %s failed", request.id)
            job.resolve_threadsafe(
                protocol.Error(code=protocol.ErrorCode.INTERNAL, message=describe(exc), id=request.id)
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
            (f" ({request.candidates} candidates, {1 + len(alternatives)} distinct)" if request.candidates > 1 else "")
            + (f" (a rewrite at strength {request.strength})" if request.start else "")
            + (f" ({1 + len(windows)} windows in one batch)" if windows else ""),
        )
        job.resolve_threadsafe(self._result(job, answer, alternatives, windows))

    def _result(
        self,
        job: Job,
        answer: Answer,
        alternatives: list[Answer] | None = None,
        windows: list[protocol.WindowResult] | None = None,
    ) -> protocol.Result:
        timings = attrs.evolve(answer.timings, queue_ms=round(job.queue_ms(), 3))
        others = alternatives or []
        prompt = ""
        if job.request.echo and self.loaded is not None:  # laid out again: a millisecond, and only when asked
            prompt = self.loaded.decode_prompt(prompt_ids(self.loaded, job.request))
        return protocol.Result(
            id=job.request.id,
            text=answer.text,
            stop=answer.stop,
            timings=timings,
            alternatives=[other.text for other in others],
            prompt=prompt,
            windows=windows or [],
            confidence=answer.confidence,
            alternative_confidence=[other.confidence for other in others] if all(o.confidence for o in others) else [],
        )
