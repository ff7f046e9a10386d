"""The seam between the model thread and what runs the canvases: :class:`CanvasRuntime`, which
``diffgemma_engine.service.worker.ModelWorker`` takes, and :class:`Task`, a queued request as a runtime sees it
(``diffgemma_engine.service.jobs.Job`` is one). The worker owns the queue, the replies and the errors' wire form;
a runtime owns the model (or the server that holds it), how many requests run together, and how one runs."""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Protocol

from ..loading.model import LoadedModel
from ..loading.model_info import ModelInfo
from ..request.infill import Answer
from ..shared import protocol

Answered = tuple[Answer, list[Answer]]
"""A request's answer, and the other distinct answers of its candidates."""


class RowsDidNotFit(Exception):
    """Requests run together did not fit in memory (already logged): the worker runs them one by one."""


class Task(Protocol):
    """A queued request: what it asks, its document's cache key, its stop check and what is left of its deadline."""

    @property
    def request(self) -> protocol.Infill: ...

    @property
    def key(self) -> Hashable: ...

    @property
    def deadline(self) -> float | None: ...

    def should_stop(self) -> str | None: ...

    def time_left_ms(self) -> float | None: ...


class CanvasRuntime(Protocol):
    """What runs the canvases. Every method is called on the model thread; ``state``, ``notes`` and ``stop`` also
    from the socket side."""

    def start(self) -> LoadedModel:
        """Load the model, or start or attach to what holds it, and warm up; the checkpoint's facts (how prompts
        are laid out and answers decoded). Raises when it cannot serve."""
        ...

    def info(self) -> ModelInfo:
        """What clients are told of the model and where it runs, once started."""
        ...

    def rows_together(self) -> int:
        """How many queued requests may run together now (1: one at a time)."""
        ...

    def joins(self, first: protocol.Infill, other: protocol.Infill) -> bool:
        """Whether ``other`` can run together with ``first``."""
        ...

    def run(self, task: Task) -> Answered:
        """Run one request laid out as ``diffgemma_engine.request.infill.lay_out`` lays it out; ``EngineError``
        for a request it refuses."""
        ...

    def run_windows(self, task: Task) -> list[Answered]:
        """A rewrite with more places of its document (``Infill.windows``): each window's answer, in order, all
        run together (one batch, or all in flight at once); ``EngineError`` for a request it refuses."""
        ...

    def run_together(self, tasks: Sequence[Task]) -> list[Answer]:
        """Run requests that ``joins`` together; ``RowsDidNotFit`` when they do not fit in memory together."""
        ...

    def state(self) -> str:
        """How what runs the canvases is doing, for stats ("": nothing to say)."""
        ...

    def notes(self) -> list[str]:
        """What its answers leave out of the figures, for stats."""
        ...

    def stop(self) -> None:
        """Stop what it started."""
        ...


def distinct_alternatives(answers: list[Answer]) -> list[Answer]:
    """The ``answers[1:]`` whose texts differ from the first and from each other (empty ones left out)."""
    alternatives: list[Answer] = []
    for other in answers[1:]:
        if other.text and other.text != answers[0].text and other.text not in [kept.text for kept in alternatives]:
            alternatives.append(other)
    return alternatives
