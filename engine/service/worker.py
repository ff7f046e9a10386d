"""The model thread: the only thread that touches torch. Loads the model, then serves jobs one by one."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path

import attrs
import torch

from ..canvas.captured import CapturedLoop, serving_shapes
from ..canvas.step_mode import StepMode
from ..canvas.warmup import trace_serving_shapes
from ..errors import EngineError, describe
from ..loading.hub import checkpoint_folder
from ..loading.model import LoadedModel, load_facts, load_model
from ..loading.model_info import ModelInfo
from ..request.batch import Row, compatible, run_batch
from ..request.infill import Answer, check_request, prompt_ids, run_infill
from ..request.on_vllm import run_on_vllm
from ..shared import protocol
from ..vllm.client import VllmError
from ..vllm.completions import SEEDS_REPRODUCE
from ..vllm.process import VllmRuntime, VllmSupervisor
from .jobs import DEFAULT_MAX_BATCH, Job, JobQueue

logger = logging.getLogger(__name__)

"""Out of memory, a request's canvas is halved down to this many tokens before giving up."""


def _release_device_memory(loaded: LoadedModel) -> None:
    """Give the allocator's cached blocks back after an out-of-memory error, so that a retry can use them."""
    if loaded.device.type == "cuda":
        torch.cuda.empty_cache()
    elif loaded.device.type == "mps":
        torch.mps.empty_cache()


VLLM_ATTACH_WAIT_S = 600.0
"""How long a starting engine waits for the ``/health`` of a vLLM it attaches to."""
VLLM_REPLY_GRACE_S = 1.0
"""How long past its own deadline a request waits for vLLM's reply (its step budget was sent ahead: a healthy vLLM
answers within the deadline)."""
VLLM_START_WAIT_S = 3600.0
"""How long it waits for one it starts (loading the release from a slow disk takes minutes; a vLLM that exits
ends the wait at once)."""


class VllmRequestError(EngineError):
    """vLLM refused a request or could not be reached: the request's ``model_error``."""

    CODE = protocol.ErrorCode.MODEL_ERROR


def distinct_alternatives(answers: list[Answer]) -> list[str]:
    """The texts of ``answers[1:]`` that differ from the first and from each other (empty ones left out)."""
    alternatives: list[str] = []
    for other in answers[1:]:
        if other.text and other.text != answers[0].text and other.text not in alternatives:
            alternatives.append(other.text)
    return alternatives


def batch_row(job: Job) -> Row:
    """A queued job as a row of ``diffgemma_engine.request.batch``: its request, its document's cache key, its stop
    check."""
    return Row(request=job.request, cache_key=job.key, should_stop=job.should_stop)


class ModelWorker(threading.Thread):
    """Owns the model. ``on_loaded`` (with the socket side's ``ModelInfo``) / ``on_failed`` are called from this
    thread once loading ends."""

    def __init__(
        self,
        queue: JobQueue,
        model_dir: str | Path | None,
        device: str | None,
        dtype: str | None,
        on_loaded: Callable[[ModelInfo], object],
        on_failed: Callable[[BaseException], object],
        threads: int | None = None,
        max_batch: int = DEFAULT_MAX_BATCH,
        step_mode: StepMode = StepMode.AUTO,
        max_memory: str | None = None,
        quantization: str | None = None,
        vllm: VllmRuntime | None = None,
    ) -> None:
        super().__init__(name="diffgemma-model", daemon=True)
        self.vllm = vllm
        """``serve --runtime vllm``: the server that runs the canvases (None: this process's own loop)."""
        self._notes: set[str] = set()
        """What vLLM's replies left out of the figures (``run_on_vllm``'s notes)."""
        self.supervisor: VllmSupervisor | None = None
        """What starts or attaches to that server and watches it, once the checkpoint's facts are read."""
        self.queue = queue
        self.model_dir = model_dir
        self.device = device
        self.dtype = dtype
        self.max_memory = max_memory
        self.quantization = quantization
        self.on_loaded = on_loaded
        self.on_failed = on_failed
        self.threads = threads
        self.max_batch = max_batch
        self.step_mode = step_mode
        self.loaded: LoadedModel | None = None

    def run(self) -> None:
        """Load, warm up, then serve until the queue is closed."""
        if self.threads:
            torch.set_num_threads(self.threads)
        try:
            if self.vllm is None:
                self.loaded = load_model(
                    self.model_dir, self.device, self.dtype, max_memory=self.max_memory, quantization=self.quantization
                )
                self._warm_up(self.loaded)
            else:  # the weights are vLLM's: the engine reads the rest
                self.loaded = load_facts(self.model_dir)
                folder = checkpoint_folder(self.model_dir)
                self.supervisor = self.vllm.supervisor(folder, self.loaded.canvas_length, self.loaded.sampler.max_steps)
                self.supervisor.start()
                self.supervisor.wait_ready(VLLM_START_WAIT_S if self.vllm.executable else VLLM_ATTACH_WAIT_S)
        except BaseException as exc:
            logger.exception("model load failed")
            self.on_failed(exc)
            return
        if self.vllm is not None:  # what clients and doctor see as the device: the runtime, its version, where
            server = self.vllm.server
            runtime = f"vllm {server.version() or '(version unknown)'} at {server.where()}"
            if self.vllm.executable is not None:
                runtime += f" (started by the engine: {self.vllm.executable})"
            logger.info("canvases run by %s", runtime)
            self.on_loaded(attrs.evolve(self.loaded.info(), device=runtime, seeds_reproduce=SEEDS_REPRODUCE))
            self._serve_jobs(self.loaded)
            return
        self.step_mode = self.step_mode.on(self.loaded.device.type)
        logger.info("denoising step: %s", self.step_mode.value)
        if self.step_mode is StepMode.COMPILED:  # in the background: requests are served eagerly until it is done
            self.loaded.serving.step.start_compiling(warm_up=trace_serving_shapes)
        if self.step_mode is StepMode.CAPTURED:  # in the background too: served eagerly until every shape is captured
            loaded = self.loaded
            canvases = [loaded.canvas_length, loaded.line_canvas_length or loaded.canvas_length]
            shapes = serving_shapes(canvases, loaded.max_prompt_tokens)
            loaded.serving.loop = CapturedLoop(loaded.model, loaded.sampler, shapes)
            loaded.serving.loop.start()
        self.on_loaded(self.loaded.info())  # after compiling starts, so that no client sees "eager" meanwhile
        self._serve_jobs(self.loaded)

    def _serve_jobs(self, loaded: LoadedModel) -> None:
        """Serve until the queue is closed: compatible jobs batched, each alone with vLLM (it batches its own)."""
        while (job := self.queue.take()) is not None:
            batch = self._batch_for(loaded, job) if self.vllm is None else [job]
            if len(batch) > 1:
                self._serve_batch(loaded, batch)
            else:
                self._serve(loaded, job)

    def _batch_for(self, loaded: LoadedModel, job: Job) -> list[Job]:
        """``job`` and the queued jobs that can share its decoder passes (up to ``max_batch``)."""
        if self.max_batch <= 1 or job.cancel_reason is not None or loaded.serving.prefix_cache is None:
            return [job]
        rows = min(self.max_batch, loaded.max_rows)
        if rows <= 1:
            return [job]
        return [job, *self.queue.take_matching(lambda other: self._joins(job, other, loaded), rows - 1)]

    @staticmethod
    def _joins(job: Job, other: Job, loaded: LoadedModel) -> bool:
        """Whether the queued ``other`` can share ``job``'s decoder passes (not if it is already cancelled)."""
        return other.cancel_reason is None and compatible(job.request, other.request, loaded)

    def _serve_batch(self, loaded: LoadedModel, jobs: list[Job]) -> None:
        started = time.monotonic()
        for job in jobs:
            job.started = started
        try:
            results = run_batch(loaded, [batch_row(job) for job in jobs])
        except torch.OutOfMemoryError:
            _release_device_memory(loaded)
            logger.warning("out of memory with a batch of %d rows: serving its requests one by one", len(jobs))
            for job in jobs:
                self._serve(loaded, job)
            return
        except Exception:
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
            if self.vllm is not None:
                (text, stop, timings), alternatives = self._run_on_vllm(loaded, job, self.vllm)
            elif request.candidates > 1:
                (text, stop, timings), alternatives = self._run_candidates(loaded, job)
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
            + (f" (a rewrite at strength {request.strength})" if request.start else ""),
        )
        job.resolve_threadsafe(self._result(job, text, stop, timings, alternatives))

    def _run_on_vllm(self, loaded: LoadedModel, job: Job, vllm: VllmRuntime) -> tuple[Answer, list[str]]:
        """The request run by vLLM: the first choice's answer and the other distinct ones. vLLM's refusal or
        absence is the request's ``model_error``, with vLLM's message (or, while it restarts, why)."""
        try:
            answers = run_on_vllm(
                loaded,
                job.request,
                vllm.server,
                vllm.model_name,
                job.should_stop,
                job.time_left_ms(),
                self._notes,
                wait_until=lambda: self._vllm_reply_by(job),
            )
        except VllmError as exc:
            down = self.supervisor.down_reason() if self.supervisor is not None else None
            raise VllmRequestError(down or str(exc)) from exc
        return answers[0], distinct_alternatives(answers)

    def _vllm_reply_by(self, job: Job) -> float | None:
        """When ``job`` stops waiting for vLLM's reply (monotonic; None: only ``vllm.client``'s own bound): its
        deadline and a grace, and no later than the deadline of a job waiting behind it, so that a vLLM that drips
        its reply or never ends it delays no other document past its deadline (the request is dropped in vLLM)."""
        limits = [job.deadline + VLLM_REPLY_GRACE_S] if job.deadline is not None else []
        waiting = self.queue.next_deadline()
        if waiting is not None:
            limits.append(waiting)
        return min(limits, default=None)

    def runtime_state(self) -> str:
        """How vLLM is doing (``healthy``, starting, restarting: why), for stats; "" for the engine's own loop."""
        return self.supervisor.state() if self.supervisor is not None else ""

    def runtime_notes(self) -> list[str]:
        """What vLLM's replies have left out of the figures so far, for stats."""
        return sorted(self._notes)

    def stop_runtime(self) -> None:
        """Stop the vLLM this engine started (and the watch of one it attached to)."""
        if self.supervisor is not None:
            self.supervisor.stop()

    def _run_candidates(self, loaded: LoadedModel, job: Job) -> tuple[Answer, list[str]]:
        """``candidates`` canvases for one prompt in one batch: the first row's answer and the other distinct ones.
        As many as the memory allows (``loaded.max_rows``); out of memory, half as many, down to one."""
        count = min(job.request.candidates, loaded.max_rows)
        if count < job.request.candidates:
            logger.info("request %s: %d of %d candidates fit", job.request.id, count, job.request.candidates)
        while count > 1:
            try:
                rows = run_batch(loaded, [batch_row(job)] * count)
                break
            except torch.OutOfMemoryError:
                _release_device_memory(loaded)
                logger.warning(
                    "request %s: out of memory with %d candidates; trying %d", job.request.id, count, count // 2
                )
                count //= 2
        else:
            return self._run_with_memory_fallback(loaded, job.request, job), []
        return rows[0], distinct_alternatives(rows)

    @staticmethod
    def _run_with_memory_fallback(loaded: LoadedModel, request: protocol.Infill, job: Job) -> Answer:
        """Run the request. Out of memory, shed what costs nothing in quality first: the other documents' encoded
        prompts (the prefix cache); then a canvas longer than the model's own is halved down to it. Never quietly
        below the canvas the model was trained on (256 for the release): what it writes in a shorter one is not
        what it was trained to write, so past that the request fails, saying so."""
        cache_dropped = False
        while True:
            try:
                time_left_ms = job.time_left_ms()
                return run_infill(loaded, request, job.should_stop, cache_key=job.key, time_left_ms=time_left_ms)
            except torch.OutOfMemoryError as exc:
                _release_device_memory(loaded)
                canvas, _ = check_request(loaded, request)
                if not cache_dropped and loaded.serving.prefix_cache is not None:
                    cache_dropped = True
                    dropped = loaded.serving.prefix_cache.drop_others(job.key)
                    if dropped:
                        logger.warning(
                            "request %s: out of memory at canvas %d; dropped %d cached prompts, retrying",
                            request.id,
                            canvas,
                            dropped,
                        )
                        continue
                if canvas <= loaded.canvas_length:
                    raise torch.OutOfMemoryError(
                        f"{exc} (at canvas {canvas}; the model's own is {loaded.canvas_length} and a shorter one "
                        "would change what it writes: free memory, or use a smaller model or quantization)"
                    ) from exc
                smaller = max(loaded.canvas_length, canvas // 2)
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
