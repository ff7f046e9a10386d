"""``python -m benchmarks.size_sweep``: the random-weight checkpoints it replays typing against."""

from __future__ import annotations

import math
from pathlib import Path

from safetensors import safe_open

from benchmarks.size_sweep import random_checkpoint
from diffgemma_engine.loading.model import load_model
from diffgemma_engine.loading.quantize_policy import MULTIMODAL_MODULES


def test_the_size_sweep_builds_a_servable_random_model_of_each_size(tmp_path: Path) -> None:
    """``benchmarks.size_sweep``'s checkpoints: the shipped model's tokenizer, canvas and hints, a size's shape."""
    params = random_checkpoint("test", tmp_path / "test")
    loaded = load_model(tmp_path / "test")
    vision = 0  # the vision tower is saved but never loaded (engine.text_only)
    for weights in (tmp_path / "test").glob("*.safetensors"):
        with safe_open(weights, "pt") as stored:
            for name in stored.keys():
                if any(f"{module}." in name for module in MULTIMODAL_MODULES):
                    vision += math.prod(stored.get_slice(name).get_shape())
    assert sum(parameter.numel() for parameter in loaded.model.parameters()) == params - vision
    assert loaded.model.config.get_text_config().hidden_size == 64
    assert (loaded.canvas_length, loaded.line_canvas_length, loaded.max_prompt_tokens) == (32, 16, 384)
