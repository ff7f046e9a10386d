"""Deadlines into step budgets: running estimates of how long encoding and a denoising step take, and the floor
of steps a deadline may not cut a schedule below.

Pure arithmetic (no torch): ``diffgemma_engine.request.infill`` asks it how many steps fit in what is left of a
request's deadline, and tells it how long each request took. A deadline that cannot afford the floor makes the answer
later, not worse: the budget never goes under it (``StepClock.step_budget``), and the deadline does not stop the loop
before the floor has run (``hold_deadline``).
"""

from __future__ import annotations

import math
from collections.abc import Callable

MIN_STEP_SHARE = 0.5
"""The default floor, as a share of the model's schedule: half of it. The shipped model keeps about 60% of its
pass@1 on HumanEval-infilling at 8 of its 16 steps and loses nearly all of it at 4 and below (``benchmarks/README.md``,
"How few steps an answer survives"); a checkpoint's ``diffgemma.json`` ``min_steps`` sets its own."""

DEADLINE = "deadline"
"""The stop reason a deadline gives (``protocol.StopReason.DEADLINE``'s value)."""


def default_min_steps(max_steps: int) -> int:
    """The floor for a model whose schedule has ``max_steps`` steps, when its checkpoint names none."""
    return max(1, math.ceil(max_steps * MIN_STEP_SHARE))


def floor_for(steps: int, min_steps: int, model_steps: int) -> int:
    """The fewest steps a deadline leaves a schedule of ``steps``: the model's ``min_steps`` (out of its
    ``model_steps``) in the same proportion (a shorter canvas runs proportionally fewer steps), at most ``steps``."""
    return min(steps, max(1, math.ceil(steps * min_steps / max(1, model_steps))))


class StepClock:
    """Running estimates of encode and per-step time, per canvas length, to turn deadlines into step budgets."""

    SMOOTHING = 0.2

    def __init__(self) -> None:
        self.encode_ms: float | None = None
        self.step_ms: dict[int, float] = {}

    def observe(self, canvas_length: int, encode_ms: float, denoise_ms: float, steps: int) -> None:
        """Fold one request's times into the estimates."""
        self.encode_ms = self._blend(self.encode_ms, encode_ms)
        if steps:
            self.step_ms[canvas_length] = self._blend(self.step_ms.get(canvas_length), denoise_ms / steps)

    def step_budget(self, canvas_length: int, max_steps: int, time_left_ms: float, min_steps: int = 1) -> int:
        """The most steps expected to fit in ``time_left_ms``, never fewer than ``min_steps`` (nor more than
        ``max_steps``); ``max_steps`` before any estimate."""
        step_ms = self.step_ms.get(canvas_length)
        if step_ms is None or step_ms <= 0:
            return max_steps
        affordable = int((time_left_ms - (self.encode_ms or 0.0)) / step_ms)
        return max(min(min_steps, max_steps), 1, min(max_steps, affordable))

    def _blend(self, old: float | None, new: float) -> float:
        return new if old is None else old + self.SMOOTHING * (new - old)


def hold_deadline(should_stop: Callable[[], str | None], steps: int) -> Callable[[], str | None]:
    """``should_stop`` (asked before each step), except that a deadline does not stop the first ``steps`` steps: a
    cancel or a newer request still does."""
    asked = 0

    def check() -> str | None:
        nonlocal asked
        reason = should_stop()
        asked += 1
        if reason == DEADLINE and asked <= steps:
            return None
        return reason

    return check
