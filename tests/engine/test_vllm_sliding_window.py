"""Issue 41 item 4, diagnosed: the release-format memorized checkpoint answers ``<pad>`` through vLLM because vLLM
centres a sliding window on each canvas row, where transformers (and this project's loop and training) give every
row the last ``W - 1`` prompt tokens and the whole canvas (benchmarks/vllm_sliding_window.py). No vLLM here: the
project's own step, under either mask, gives the memorized answer under its own and vLLM's ``<pad>`` under vLLM's."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from benchmarks.vllm_sliding_window import agreeing_prompt_tokens, answer_of, answered_request, draw, sliding_mask
from diffgemma_engine.loading.model import load_model
from tests.support.release_format import RAW_ANSWER


@pytest.mark.parametrize(("window", "canvas"), [(1024, 256), (512, 32), (128, 32)])
def test_the_masks_agree_exactly_up_to_the_window_less_the_canvas(window: int, canvas: int) -> None:
    """The release (window 1024, canvas 256): prompts of 768 tokens or fewer see the same keys through vLLM."""
    most = agreeing_prompt_tokens(window, canvas)
    assert most == window - canvas
    for prompt in (1, most // 2, most):
        assert torch.equal(
            sliding_mask("transformers", prompt, canvas, window), sliding_mask("vllm", prompt, canvas, window)
        )
    ours, vllms = (sliding_mask(kind, most + 1, canvas, window) for kind in ("transformers", "vllm"))
    assert torch.equal(ours[0], vllms[0])  # the first canvas row still agrees
    assert bool(ours[-1, 0]) and not bool(vllms[-1, 0])  # the last one lost the oldest prompt token


def test_the_window_alone_turns_the_memorized_answer_into_pad(release_memorized_dir: Path) -> None:
    """The checkpoint (window 128, canvas 256, a prompt of 185 ids): the same step, seed and prompt ids, with only
    the sliding-window mask changed."""
    loaded = load_model(release_memorized_dir)
    request = answered_request()
    ours, _ = draw(loaded, request, "transformers", seed=0)
    assert answer_of(loaded, ours) == RAW_ANSWER
    vllms, _ = draw(loaded, request, "vllm", seed=0)
    assert loaded.tokenizer.decode(vllms).startswith("```python\n    return <pad>")  # what vLLM itself answers
