"""A stop request reaches the model between denoising steps."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import DiffusionGemmaForBlockDiffusion

from diffgemma_engine.canvas.denoise import run_canvas
from diffgemma_engine.canvas.sampler import SamplerSettings


def test_stop_check_ends_the_loop_within_one_step(random_model_dir: Path) -> None:
    model = DiffusionGemmaForBlockDiffusion.from_pretrained(random_model_dir).eval()
    prompt = torch.randint(20, 8000, (1, 40))
    steps_seen: list[int] = []
    cancel_after = 3

    out = run_canvas(
        model,
        prompt,
        32,
        SamplerSettings(max_steps=48),
        generator=torch.Generator().manual_seed(0),
        should_stop=lambda: "cancelled" if len(steps_seen) >= cancel_after else None,
        on_step=steps_seen.append,
    )

    assert out.stopped_by == "cancelled"
    assert out.steps == cancel_after
    assert steps_seen == [1, 2, 3]


def test_random_model_runs_every_step_without_a_stop(random_model_dir: Path) -> None:
    model = DiffusionGemmaForBlockDiffusion.from_pretrained(random_model_dir).eval()
    out = run_canvas(model, torch.randint(20, 8000, (1, 40)), 16, SamplerSettings(max_steps=5))
    assert out.stopped_by is None
    assert out.steps == 5
    assert out.tokens.shape == (1, 16)
