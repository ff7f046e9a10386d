"""One statement of the denoising step (``diffgemma_engine.canvas.step.denoise_step``): every way the engine runs a
canvas goes through it, and nothing else in the engine states a step's acceptance or stopping rule."""

from __future__ import annotations

import ast
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import DiffusionGemmaForBlockDiffusion, DynamicCache

from diffgemma_engine.canvas import step as step_module
from diffgemma_engine.canvas.caches import encode_prompt
from diffgemma_engine.canvas.denoise import denoise_canvas
from diffgemma_engine.canvas.sampler import SamplerSettings
from diffgemma_engine.canvas.static import StaticPrompt, denoise_static, prompt_bucket
from diffgemma_engine.loading.model import load_model

ENGINE = Path(__file__).resolve().parents[2] / "engine"
STEP_RULES = {"accept_mask", "settled", "pin_scores"}
"""The step's own pieces (its steps 2, 3 and 7): only a statement of the step calls them."""


def _callers(names: set[str]) -> set[str]:
    """``module:function`` for each function in the engine whose body calls one of ``names``."""
    found = set()
    for path in ENGINE.rglob("*.py"):
        if "training" in path.parts:  # the trainer's objective, not a serving step
            continue
        tree = ast.parse(path.read_text())
        for function in ast.walk(tree):
            if not isinstance(function, ast.FunctionDef):
                continue
            for node in ast.walk(function):
                if isinstance(node, ast.Call):
                    callee = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
                    if callee in names:
                        found.add(f"{path.relative_to(ENGINE).as_posix()}:{function.name}")
    return found


def test_one_function_states_the_step() -> None:
    # sample_accepted is the fast sampler's acceptance and draw as one call, for the sampler's own tests
    assert _callers(STEP_RULES) == {"canvas/step.py:denoise_step", "canvas/sampler.py:sample_accepted"}
    assert _callers({"model_forward"}) <= {"canvas/step.py:eager_scores", "canvas/compiled.py:eager_forward"}


@pytest.fixture(scope="module")
def shipped() -> DiffusionGemmaForBlockDiffusion:
    torch.manual_seed(0)
    return load_model(None).model


def _view(model: DiffusionGemmaForBlockDiffusion) -> DynamicCache:
    ids = torch.randint(10, 8000, (1, 24), generator=torch.Generator().manual_seed(0))
    cache = DynamicCache(config=model.config.get_text_config(decoder=True))
    with torch.inference_mode():
        encode_prompt(model, ids, cache)
    return cache


def test_every_way_of_running_a_canvas_runs_the_one_step(
    shipped: DiffusionGemmaForBlockDiffusion, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The eager loop (fast and exact samplers) and the fixed-shape loop each run ``denoise_step`` once a step."""
    calls: Counter[str] = Counter()
    original = step_module.denoise_step

    def counted(parts: Any, inputs: Any, state: Any, noise: Any) -> Any:
        calls[type(parts.sampler).__name__ + (":static" if isinstance(inputs, StaticPrompt) else "")] += 1
        return original(parts, inputs, state, noise)

    monkeypatch.setattr(step_module, "denoise_step", counted)
    view = _view(shipped)
    fast = denoise_canvas(shipped, view, 1, 32, SamplerSettings(max_steps=6), torch.Generator().manual_seed(1))
    exact = denoise_canvas(
        shipped, view, 1, 32, SamplerSettings(max_steps=6, exact=True), torch.Generator().manual_seed(1)
    )
    prompt = StaticPrompt.allocate(shipped, view, 1, prompt_bucket(24), 32)
    with torch.inference_mode():
        prompt.load([view])
    static = denoise_static(shipped, prompt, SamplerSettings(max_steps=6, exact=True), torch.Generator().manual_seed(1))
    assert calls == {
        "AcceptedOnlySampler": fast.steps,
        "ExactSampler": exact.steps,
        "ExactSampler:static": static.steps,
    }
    assert min(calls.values()) >= 1
