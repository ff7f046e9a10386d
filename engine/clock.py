"""Deadlines into step budgets: running estimates of how long encoding and a denoising step take.

Pure arithmetic (no torch): ``engine.infill`` asks it how many steps fit in what is left of a request's deadline,
and tells it how long each request took.
"""

from __future__ import annotations


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

    def step_budget(self, canvas_length: int, max_steps: int, time_left_ms: float) -> int:
        """The most steps (at least 1) expected to fit in ``time_left_ms``; ``max_steps`` before any estimate."""
        step_ms = self.step_ms.get(canvas_length)
        if step_ms is None or step_ms <= 0:
            return max_steps
        affordable = int((time_left_ms - (self.encode_ms or 0.0)) / step_ms)
        return max(1, min(max_steps, affordable))

    def _blend(self, old: float | None, new: float) -> float:
        return new if old is None else old + self.SMOOTHING * (new - old)
