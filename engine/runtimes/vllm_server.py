"""vLLM as the runtime (``serve --runtime vllm``): the checkpoint's facts read here without its weights
(``diffgemma_engine.loading.model.load_facts``), the server started or attached to and watched
(``diffgemma_engine.vllm.process``), and each request laid out by the engine and run by vLLM
(``diffgemma_engine.request.on_vllm``), one at a time (vLLM batches its own)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from pathlib import Path

import attrs

from ..errors import EngineError
from ..loading.hub import checkpoint_folder
from ..loading.model import LoadedModel, load_facts
from ..loading.model_info import ModelInfo
from ..request.infill import Answer
from ..request.on_vllm import run_on_vllm, run_windows_on_vllm
from ..shared import protocol
from ..vllm.client import VllmError
from ..vllm.completions import SEEDS_REPRODUCE
from ..vllm.process import VllmRuntime, VllmSupervisor
from .seam import Answered, Task, distinct_alternatives

logger = logging.getLogger(__name__)

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


def no_deadline_waiting() -> float | None:
    """No request waits behind this one (a runtime used without a queue)."""
    return None


@attrs.define
class VllmServed:
    """The :class:`~diffgemma_engine.runtimes.seam.CanvasRuntime` of a vLLM server. ``next_deadline``: the
    deadline (monotonic) of the first request waiting behind the one that runs, if any."""

    vllm: VllmRuntime
    model_dir: str | Path | None
    next_deadline: Callable[[], float | None] = no_deadline_waiting
    loaded: LoadedModel | None = None
    supervisor: VllmSupervisor | None = None
    """What starts or attaches to that server and watches it, once the checkpoint's facts are read."""
    _notes: set[str] = attrs.field(factory=set)
    """What vLLM's replies left out of the figures (``run_on_vllm``'s notes)."""

    def start(self) -> LoadedModel:
        """Read the checkpoint's facts (the weights are vLLM's), then start or attach to vLLM and wait for it."""
        loaded = self.loaded = load_facts(self.model_dir)
        folder = checkpoint_folder(self.model_dir)
        self.supervisor = self.vllm.supervisor(folder, loaded.canvas_length, loaded.sampler.max_steps)
        self.supervisor.start()
        self.supervisor.wait_ready(VLLM_START_WAIT_S if self.vllm.executable else VLLM_ATTACH_WAIT_S)
        return loaded

    def _facts(self) -> LoadedModel:
        if self.loaded is None:
            raise RuntimeError("vLLM has not been started")
        return self.loaded

    def info(self) -> ModelInfo:
        """What clients and doctor see as the device: the runtime, its version, where; the step is vLLM's."""
        server = self.vllm.server
        runtime = f"vllm {server.version() or '(version unknown)'} at {server.where()}"
        if self.vllm.executable is not None:
            runtime += f" (started by the engine: {self.vllm.executable})"
        logger.info("canvases run by %s", runtime)
        return attrs.evolve(
            self._facts().info(),
            device=runtime,
            seeds_reproduce=SEEDS_REPRODUCE,
            compile_state=lambda: protocol.StepState.EAGER.value,
        )

    def rows_together(self) -> int:
        return 1  # vLLM batches the requests of every document itself

    def joins(self, first: protocol.Infill, other: protocol.Infill) -> bool:
        return False

    def run(self, task: Task) -> Answered:
        """The request run by vLLM: the first choice's answer and the other distinct ones."""
        answers = self._answers(task, task.request)
        return answers[0], distinct_alternatives(answers)

    def run_windows(self, task: Task) -> list[Answered]:
        answered = run_windows_on_vllm(task.request, lambda window: self._answers(task, window))
        return [(answers[0], distinct_alternatives(answers)) for answers in answered]

    def _answers(self, task: Task, request: protocol.Infill) -> list[Answer]:
        """``request`` (the task's, or one of its windows) run by vLLM: each choice's answer. vLLM's refusal or
        absence is the request's ``model_error``, with vLLM's message (or, while it restarts, why)."""
        try:
            return run_on_vllm(
                self._facts(),
                request,
                self.vllm.server,
                self.vllm.model_name,
                task.should_stop,
                task.time_left_ms(),
                self._notes,
                wait_until=lambda: self._reply_by(task),
            )
        except VllmError as exc:
            down = self.supervisor.down_reason() if self.supervisor is not None else None
            raise VllmRequestError(down or str(exc)) from exc

    def run_together(self, tasks: Sequence[Task]) -> list[Answer]:
        return [self.run(task)[0] for task in tasks]

    def _reply_by(self, task: Task) -> float | None:
        """When ``task`` stops waiting for vLLM's reply (monotonic; None: only ``vllm.client``'s own bound): its
        deadline and a grace, and no later than the deadline of a request waiting behind it, so that a vLLM that
        drips its reply or never ends it delays no other document past its deadline (the request is dropped in
        vLLM)."""
        limits = [task.deadline + VLLM_REPLY_GRACE_S] if task.deadline is not None else []
        if (waiting := self.next_deadline()) is not None:
            limits.append(waiting)
        return min(limits, default=None)

    def state(self) -> str:
        """How vLLM is doing (``healthy``, starting, restarting: why)."""
        return self.supervisor.state() if self.supervisor is not None else ""

    def notes(self) -> list[str]:
        """What vLLM's replies have left out of the figures so far."""
        return sorted(self._notes)

    def stop(self) -> None:
        """Stop the vLLM this engine started (and the watch of one it attached to)."""
        if self.supervisor is not None:
            self.supervisor.stop()
