"""The engine's own loop (``serve --runtime transformers``): the model loaded in this process
(``diffgemma_engine.loading.model.load_model``), its step eager, compiled or captured (``serve --step``), queued
requests with compatible canvases batched into one decoder pass, a request's candidates as rows of one batch, and
out of memory, what costs nothing in quality shed first."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

import attrs
import torch

from ..canvas.captured import CapturedLoop, serving_shapes
from ..canvas.warmup import trace_serving_shapes
from ..loading.model import LoadedModel, load_model
from ..loading.model_info import ModelInfo
from ..request.batch import Row, compatible, run_batch
from ..request.infill import Answer, check_request, run_infill
from ..request.windows import run_windows
from ..shared import protocol
from ..shared.serve_options import DEFAULT_MAX_BATCH, StepMode
from .seam import Answered, RowsDidNotFit, Task, distinct_alternatives

logger = logging.getLogger(__name__)


def release_device_memory(loaded: LoadedModel) -> None:
    """Give the allocator's cached blocks back after an out-of-memory error, so that a retry can use them."""
    if loaded.device.type == "cuda":
        torch.cuda.empty_cache()
    elif loaded.device.type == "mps":
        torch.mps.empty_cache()


def batch_row(task: Task) -> Row:
    """A queued request as a row of ``diffgemma_engine.request.batch``: its request, its document's cache key, its
    stop check."""
    return Row(request=task.request, cache_key=task.key, should_stop=task.should_stop)


@attrs.define
class OwnLoop:
    """The :class:`~diffgemma_engine.runtimes.seam.CanvasRuntime` of the model in this process."""

    model_dir: str | Path | None
    device: str | None = None
    dtype: str | None = None
    max_memory: str | None = None
    quantization: str | None = None
    max_batch: int = DEFAULT_MAX_BATCH
    step_mode: StepMode = StepMode.AUTO
    loaded: LoadedModel | None = None

    def start(self) -> LoadedModel:
        """Load, warm up with one short canvas, and start compiling or capturing the step in the background
        (requests are served eagerly until it is done)."""
        loaded = self.loaded = load_model(
            self.model_dir, self.device, self.dtype, max_memory=self.max_memory, quantization=self.quantization
        )
        run_infill(loaded, protocol.Infill(id="warm-up", uri="", prefix="def f():\n", max_steps=2))
        self.step_mode = self.step_mode.on(loaded.device.type)
        logger.info("denoising step: %s", self.step_mode.value)
        if self.step_mode is StepMode.COMPILED:
            loaded.serving.step.start_compiling(warm_up=trace_serving_shapes)
        if self.step_mode is StepMode.CAPTURED:
            canvases = [loaded.canvas_length, loaded.line_canvas_length or loaded.canvas_length]
            loaded.serving.loop = CapturedLoop(
                loaded.model, loaded.sampler, serving_shapes(canvases, loaded.max_prompt_tokens)
            )
            loaded.serving.loop.start()
        return loaded

    def _model(self) -> LoadedModel:
        if self.loaded is None:
            raise RuntimeError("the engine's own loop has not been started")
        return self.loaded

    def info(self) -> ModelInfo:
        return self._model().info()  # after compiling starts, so that no client sees "eager" meanwhile

    def rows_together(self) -> int:
        loaded = self._model()
        return 1 if loaded.serving.prefix_cache is None else min(self.max_batch, loaded.max_rows)

    def joins(self, first: protocol.Infill, other: protocol.Infill) -> bool:
        return compatible(first, other, self._model())

    def run(self, task: Task) -> Answered:
        if task.request.candidates > 1:
            return self._run_candidates(task)
        return self._run_with_memory_fallback(task.request, task), []

    def run_windows(self, task: Task) -> list[Answered]:
        rows = run_windows(self._model(), task.request, lambda window: attrs.evolve(batch_row(task), request=window))
        return [(answers[0], distinct_alternatives(answers)) for answers in rows]

    def run_together(self, tasks: Sequence[Task]) -> list[Answer]:
        loaded = self._model()
        try:
            return run_batch(loaded, [batch_row(task) for task in tasks])
        except torch.OutOfMemoryError as exc:
            release_device_memory(loaded)
            logger.warning("out of memory with a batch of %d rows: serving its requests one by one", len(tasks))
            raise RowsDidNotFit from exc

    def state(self) -> str:
        return ""

    def notes(self) -> list[str]:
        return []

    def stop(self) -> None:
        """Nothing to stop: the model goes with the process."""

    def _run_candidates(self, task: Task) -> Answered:
        """``candidates`` canvases for one prompt in one batch: the first row's answer and the other distinct ones.
        As many as the memory allows (``loaded.max_rows``); out of memory, half as many, down to one."""
        loaded, request = self._model(), task.request
        count = min(request.candidates, loaded.max_rows)
        if count < request.candidates:
            logger.info("request %s: %d of %d candidates fit", request.id, count, request.candidates)
        while count > 1:
            try:
                rows = run_batch(loaded, [batch_row(task)] * count)
                break
            except torch.OutOfMemoryError:
                release_device_memory(loaded)
                logger.warning("request %s: out of memory with %d candidates; trying %d", request.id, count, count // 2)
                count //= 2
        else:
            return self._run_with_memory_fallback(request, task), []
        return rows[0], distinct_alternatives(rows)

    def _run_with_memory_fallback(self, request: protocol.Infill, task: Task) -> Answer:
        """Run the request. Out of memory, shed what costs nothing in quality first: the other documents' encoded
        prompts (the prefix cache); then a canvas longer than the model's own is halved down to it. Never quietly
        below the canvas the model was trained on (256 for the release): what it writes in a shorter one is not
        what it was trained to write, so past that the request fails, saying so."""
        loaded = self._model()
        cache_dropped = False
        while True:
            try:
                return run_infill(
                    loaded, request, task.should_stop, cache_key=task.key, time_left_ms=task.time_left_ms()
                )
            except torch.OutOfMemoryError as exc:
                release_device_memory(loaded)
                canvas, _ = check_request(loaded, request)
                if not cache_dropped and loaded.serving.prefix_cache is not None:
                    cache_dropped = True
                    if dropped := loaded.serving.prefix_cache.drop_others(task.key):
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
