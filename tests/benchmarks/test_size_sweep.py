"""``python -m benchmarks.size_sweep``: the random-weight checkpoints it replays typing against."""

from __future__ import annotations

from pathlib import Path

from benchmarks.size_sweep import random_checkpoint
from diffgemma_engine.model import load_model


def test_the_size_sweep_builds_a_servable_random_model_of_each_size(tmp_path: Path) -> None:
    """``benchmarks.size_sweep``'s checkpoints: the shipped model's tokenizer, canvas and hints, a size's shape."""
    params = random_checkpoint("test", tmp_path / "test")
    loaded = load_model(tmp_path / "test")
    assert sum(parameter.numel() for parameter in loaded.model.parameters()) == params
    assert loaded.model.config.get_text_config().hidden_size == 64
    assert (loaded.canvas_length, loaded.line_canvas_length, loaded.max_prompt_tokens) == (32, 16, 384)
