"""The one host loop around the denoising step: between steps, never inside one, it asks ``should_stop`` and each
row's check, draws the exact sampler's random numbers, and reads the (B,) finished flags."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from .sampler import StepNoise
from .step import DecoderInputs, Step, StepState

StopCheck = Callable[[], str | None]
"""Returns a reason to stop (e.g. "cancelled") or None to go on."""


@dataclass
class Denoised:
    """What the denoising loop produced."""

    tokens: torch.Tensor  # (B, C) argmax canvas of the last step
    steps: int  # steps run
    stopped_by: str | None  # the reason from ``should_stop``, None if the loop ended on its own
    finished: torch.Tensor  # (B,) rows that settled (or were stopped by their row check)
    row_steps: list[int]  # steps each row took part in
    row_stops: list[str | None]  # each row's stop reason from its row check
    confidence: torch.Tensor | None = None  # (B, C) float32: the share of its row's steps each token was the argmax


def run_steps(
    step: Step,
    inputs: DecoderInputs,
    state: StepState,
    steps_to_run: int,
    noise: Callable[[], StepNoise] | None = None,
    should_stop: StopCheck | None = None,
    on_step: Callable[[int], None] | None = None,
    row_checks: Sequence[StopCheck] | None = None,
) -> Denoised:
    """Run ``step`` from ``state`` for at most ``steps_to_run`` steps, until every row has finished.

    ``noise`` draws a step's random numbers before it (the exact sampler's; None for a sampler that draws inside
    the step). A cancel or a row's own stop is answered before the next step starts.
    """
    batch = state.canvas.shape[0]
    finished = [False] * batch
    row_stops: list[str | None] = [None] * batch
    row_steps = [0] * batch
    steps = 0
    for _ in range(steps_to_run):
        if should_stop is not None and (reason := should_stop()) is not None:
            return _denoised(state, steps, reason, row_steps, [reason] * batch)
        stopped = False
        for row, check in enumerate(row_checks or ()):
            if not finished[row] and (reason := check()) is not None:
                finished[row], row_stops[row], stopped = True, reason, True
        if stopped:
            state.finished = torch.tensor(finished, dtype=torch.bool, device=state.finished.device)
        if all(finished):
            break
        steps += 1
        for row in range(batch):
            row_steps[row] += not finished[row]
        state = step(inputs, state, None if noise is None else noise())
        finished = state.finished.tolist()  # the one read of a step's result, after it
        if on_step is not None:
            on_step(steps)
        if all(finished):
            break
    return _denoised(state, steps, None, row_steps, row_stops)


def _denoised(
    state: StepState, steps: int, stopped_by: str | None, row_steps: list[int], row_stops: list[str | None]
) -> Denoised:
    """What the loop hands back from ``state``: copies, since a captured graph's outputs are overwritten by its next
    replay (the next request's first step)."""
    confidence = None
    if state.stable is not None:  # a new tensor: the share of each row's steps its tokens stayed the argmax
        ran = torch.tensor(row_steps, dtype=torch.float32, device=state.stable.device).clamp(min=1.0)
        confidence = (state.stable / ran[:, None]).clamp(max=1.0)
    return Denoised(state.best.clone(), steps, stopped_by, state.finished.clone(), row_steps, row_stops, confidence)
