"""Text only: the engine's load leaves the vision tower and its embedder unread, and the plan says what that saves."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from transformers import DiffusionGemmaForBlockDiffusion

from diffgemma_engine.loading import plan
from diffgemma_engine.loading.model import load_model
from diffgemma_engine.loading.quantize_policy import MULTIMODAL_MODULES
from diffgemma_engine.request.infill import run_infill
from diffgemma_engine.shared import protocol

RELEASE = Path(__file__).resolve().parents[2] / "tests" / "data" / "release"


def test_the_load_holds_no_vision_weight_and_completes(release_random_dir: Path) -> None:
    spec = plan.read_spec(release_random_dir)
    vision = [weight for weight in spec.weights if weight.kind == "vision"]
    assert vision  # the checkpoint has a vision tower, in its files
    stored = json.loads((release_random_dir / "model.safetensors.index.json").read_text())["weight_map"]
    assert any(".vision_tower." in name for name in stored)
    loaded = load_model(release_random_dir, "cpu")
    model = loaded.model
    assert type(model) is DiffusionGemmaForBlockDiffusion  # the usual class once loaded
    names = [name for name, _ in model.named_parameters(remove_duplicate=False)]
    assert names and not [name for name in names if any(f".{part}." in f".{name}" for part in MULTIMODAL_MODULES)]
    held = sum(tensor.numel() * tensor.element_size() for tensor in model.parameters())
    placed = [weight for weight in plan.text_weights(spec.weights) if not weight.buffer]
    assert held == plan.total_bytes(placed, "bfloat16")  # the weights the plan places, no more
    assert held < plan.total_bytes([weight for weight in spec.weights if not weight.buffer], "bfloat16")
    request = protocol.Infill(id="t", uri="", prefix="def f(x):\n", canvas_length=16, max_steps=2)
    text, _stop, timings = run_infill(loaded, request)
    assert isinstance(text, str) and timings.steps >= 1


def test_the_plan_states_what_text_only_saves_on_the_release(capsys: pytest.CaptureFixture[str]) -> None:
    spec = plan.read_spec(RELEASE)
    result = plan.make_plan(spec, [])
    vision = sum(weight.numel for weight in spec.weights if weight.kind == "vision" and not weight.buffer)
    assert vision / spec.parameters == pytest.approx(result.shares["vision"])
    saved = result.weights_bytes["bfloat16"] - result.loaded_bytes["bfloat16"]
    assert saved == 2 * sum(weight.numel for weight in spec.weights if weight.kind == "vision")
    assert plan.plan_json(result)["text_only"]["saved_bytes"]["bfloat16"] == saved
    assert f"{saved / plan.GIB:.1f} GiB in bf16) are never read" in plan.format_plan(result)
