"""Prefix reuse: a reused, cropped and extended encoding gives the decoder what a fresh encoding gives it."""

from __future__ import annotations

import pytest
import torch
from transformers import DiffusionGemmaForBlockDiffusion, DynamicCache

from diffgemma_engine.canvas.caches import PrefixCache, common_prefix_length, encode_prompt
from diffgemma_engine.training.configs import build_config

CANVAS = 16


@pytest.fixture(scope="module")
def model() -> DiffusionGemmaForBlockDiffusion:
    torch.manual_seed(0)
    # A 64-token sliding window, so that prompts of 150-300 tokens exercise the window (the release's is 1024).
    return DiffusionGemmaForBlockDiffusion(build_config("test", 8192, canvas_length=CANVAS, sliding_window=64)).eval()


def _decoder_logits(model: DiffusionGemmaForBlockDiffusion, cache: DynamicCache, canvas: torch.Tensor) -> torch.Tensor:
    length = cache.get_seq_length()
    positions = torch.arange(length, length + CANVAS, dtype=torch.int32).unsqueeze(0)
    with torch.inference_mode():
        return model(decoder_input_ids=canvas, cache=cache, decoder_position_ids=positions).logits


def test_reused_prefix_matches_a_fresh_encoding(model: DiffusionGemmaForBlockDiffusion) -> None:
    prefix_cache = PrefixCache(model)
    ids = torch.randint(20, 8000, (300,), generator=torch.Generator().manual_seed(1)).tolist()
    canvas = torch.randint(0, 8192, (1, CANVAS), generator=torch.Generator().manual_seed(2))
    # typing on, deleting back into the cached part, editing inside it, repeating, and a short prompt
    sequence = [ids[:200], ids[:201], ids[:150] + [5, 6, 7], ids[:250], ids[:250], ids[:40]]
    expected_reuse = [0, 200, 150, 150, 249, 39]
    for prompt, reuse in zip(sequence, expected_reuse, strict=True):
        view, reused = prefix_cache.prepare("doc", prompt)
        fresh = DynamicCache(config=model.config.get_text_config(decoder=True))
        with torch.inference_mode():
            encode_prompt(model, torch.tensor([prompt]), fresh)
        assert reused == reuse
        assert view.get_seq_length() == len(prompt)
        difference = (_decoder_logits(model, view, canvas) - _decoder_logits(model, fresh, canvas)).abs().max()
        assert difference < 1e-4, (len(prompt), reused, difference)


def test_documents_have_separate_slots_and_old_ones_are_evicted(model: DiffusionGemmaForBlockDiffusion) -> None:
    prefix_cache = PrefixCache(model, slots=2)
    a, b = [30] * 50, [40] * 50
    assert prefix_cache.prepare("a", a)[1] == 0
    assert prefix_cache.prepare("b", b)[1] == 0
    assert prefix_cache.prepare("a", [*a, 1])[1] == 50
    prefix_cache.prepare("c", b)
    assert prefix_cache.prepare("b", b)[1] == 0  # "b" was the least recently used


def test_common_prefix_length() -> None:
    assert common_prefix_length([1, 2, 3], [1, 2, 4]) == 2
    assert common_prefix_length([1, 2], [1, 2, 3]) == 2
    assert common_prefix_length([], [1]) == 0
