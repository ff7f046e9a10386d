"""Deadlines into step budgets."""

from __future__ import annotations

from diffgemma_engine.canvas.clock import StepClock


def test_no_estimate_means_the_full_budget() -> None:
    assert StepClock().step_budget(32, 48, time_left_ms=10) == 48


def test_budget_fits_the_time_left() -> None:
    clock = StepClock()
    clock.observe(32, encode_ms=20, denoise_ms=100, steps=10)  # 10 ms a step
    assert clock.step_budget(32, 48, time_left_ms=170) == 15  # (170 - 20) / 10
    assert clock.step_budget(32, 8, time_left_ms=1000) == 8
    assert clock.step_budget(32, 48, time_left_ms=5) == 1
    assert clock.step_budget(64, 48, time_left_ms=5) == 48  # no estimate for this canvas yet


def test_estimates_follow_recent_requests() -> None:
    clock = StepClock()
    clock.observe(32, encode_ms=10, denoise_ms=100, steps=10)
    for _ in range(30):
        clock.observe(32, encode_ms=10, denoise_ms=200, steps=10)
    assert abs(clock.step_ms[32] - 20) < 0.1
