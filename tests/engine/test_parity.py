"""The engine's own denoising loop produces the same tokens as transformers' ``model.generate``."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer, DiffusionGemmaForBlockDiffusion

from diffgemma_engine.canvas.denoise import run_canvas
from diffgemma_engine.canvas.sampler import SamplerSettings
from diffgemma_engine.request.infill import cut_at_eos
from diffgemma_engine.shared.prompt import PromptParts, build_fim_prompt, special_ids_from
from tests.support.models import MEMORIZED_MIDDLE, MEMORIZED_PREFIX, MEMORIZED_SUFFIX


def _prompt(model_dir: Path) -> tuple[DiffusionGemmaForBlockDiffusion, AutoTokenizer, torch.Tensor]:
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = DiffusionGemmaForBlockDiffusion.from_pretrained(model_dir).eval()
    special = special_ids_from(tokenizer.get_vocab().get)
    parts = PromptParts(prefix=MEMORIZED_PREFIX, suffix=MEMORIZED_SUFFIX)
    prompt = build_fim_prompt(parts, lambda s: tokenizer.encode(s, add_special_tokens=False), special, 512)
    return model, tokenizer, torch.tensor([prompt.ids])


def _settings(model: DiffusionGemmaForBlockDiffusion) -> SamplerSettings:
    g = model.generation_config
    return SamplerSettings(
        max_steps=g.max_denoising_steps,
        t_min=g.t_min,
        t_max=g.t_max,
        entropy_bound=g.sampler_config.entropy_bound,
        stability_threshold=g.stability_threshold,
        confidence_threshold=g.confidence_threshold,
        exact=True,
    )


@pytest.mark.parametrize("fixture", ["random_model_dir", "memorized_model_dir"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_same_tokens_as_generate(fixture: str, seed: int, request: pytest.FixtureRequest) -> None:
    model, _, prompt = _prompt(request.getfixturevalue(fixture))
    canvas = model.config.canvas_length
    eos = set(model.generation_config.eos_token_id)
    pad = model.generation_config.pad_token_id

    torch.manual_seed(seed)
    reference = model.generate(input_ids=prompt, max_new_tokens=canvas).sequences[0, prompt.shape[1] :].tolist()
    ours = run_canvas(model, prompt, canvas, _settings(model), generator=torch.Generator().manual_seed(seed))

    assert cut_at_eos(ours.tokens[0].tolist(), eos, pad) == cut_at_eos(reference, eos, pad)
    assert ours.tokens.shape == (1, canvas)


@pytest.mark.parametrize("exact", [True, False])
def test_memorized_model_settles_early_with_the_expected_middle(memorized_model_dir: Path, exact: bool) -> None:
    """A trained canvas stops on the stable-and-confident rule, well before the step limit (both samplers)."""
    model, tokenizer, prompt = _prompt(memorized_model_dir)
    settings = dataclasses.replace(_settings(model), exact=exact)
    out = run_canvas(model, prompt, model.config.canvas_length, settings, generator=torch.Generator().manual_seed(0))
    tokens, found_eos = cut_at_eos(out.tokens[0].tolist(), set(model.generation_config.eos_token_id), 0)
    assert found_eos
    assert tokenizer.decode(tokens) == MEMORIZED_MIDDLE
    assert out.stopped_by is None
    assert bool(out.finished.all())
    assert out.steps < settings.max_steps
