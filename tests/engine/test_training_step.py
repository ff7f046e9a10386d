"""The training step's full-sequence block diffusion computes, for the canvas block, what inference computes."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import DiffusionGemmaForBlockDiffusion, DynamicCache

from diffgemma_engine.training.configs import build_config
from diffgemma_engine.training.data import Example
from diffgemma_engine.training.objective import diffusion_forward, pad_batch, weighted_ce

CANVAS = 8


def test_canvas_logits_match_an_inference_call() -> None:
    torch.manual_seed(0)
    model = DiffusionGemmaForBlockDiffusion(build_config("test", 512, canvas_length=CANVAS)).eval()
    prompt = torch.randint(10, 512, (21,)).tolist()  # two whole prompt blocks and a partial one before the canvas
    middle = torch.randint(10, 512, (CANVAS,)).tolist()
    batch = pad_batch([Example(ids=prompt + middle, prompt_len=len(prompt), middle_text="", kind="line")])
    with torch.no_grad():
        logits, noisy = diffusion_forward(model, batch, t_override=0.6, self_condition=False)
        cache = DynamicCache(config=model.config.get_text_config(decoder=True))
        reference = model(
            input_ids=torch.tensor([prompt]), decoder_input_ids=noisy[:, len(prompt) :], cache=cache
        ).logits
    canvas = logits[:, len(prompt) :]
    assert torch.allclose(canvas, reference, atol=1e-4), (canvas - reference).abs().max()
    assert not torch.equal(noisy[0, len(prompt) :], torch.tensor(middle))  # t = 0.6 corrupted some tokens


def test_the_loss_scores_every_real_position_and_weighs_the_canvas() -> None:
    batch = pad_batch(
        [
            Example(ids=list(range(20, 40)), prompt_len=12, middle_text="", kind="line"),
            Example(ids=list(range(20, 30)), prompt_len=2, middle_text="", kind="line"),
        ]
    )
    assert batch["scored"].sum() == 30  # both rows, all of their tokens; the row padding is not scored
    assert batch["middle"][0, 12:20].all() and not batch["middle"][0, :12].any()
    perfect = torch.nn.functional.one_hot(batch["ids"], 64).float() * 50
    assert weighted_ce(perfect, batch, 2.0) < 1e-6
    wrong = perfect.roll(1, dims=-1)
    assert weighted_ce(wrong, batch, 2.0) > 10


def test_each_row_is_cut_into_blocks_of_its_own_canvas() -> None:
    """A rest-of-line example denoises the line canvas (4 here) beside a model-canvas one (8): each row's blocks,
    counted back from its canvas, are its canvas long."""
    batch = pad_batch(
        [
            Example(ids=list(range(20, 40)), prompt_len=12, middle_text="", kind="line"),
            Example(ids=list(range(20, 34)), prompt_len=10, middle_text="", kind="rest_of_line"),
        ]
    )
    assert batch["middle"][1, 10:14].all() and not batch["middle"][1, 14:].any()
    assert batch["start"][0, :12].tolist() == [0] * 4 + [4] * 8
    assert batch["start"][1, :14].tolist() == [0, 0, 2, 2, 2, 2, 6, 6, 6, 6, 10, 10, 10, 10]
    assert len(set(batch["block"][1, 10:14].tolist())) == 1 and batch["block"][1, 9] != batch["block"][1, 10]


def test_a_trained_fixture_that_did_not_learn_its_answer_fails_with_its_loss(tmp_path: Path) -> None:
    """The memorized checkpoints are kept only once the engine answers them as the tests expect (a fresh clone's
    checkpoint once answered "ppon    return" and a test failed on it): one that did not learn fails its build."""
    from tests.support.models import build_memorized

    with pytest.raises(RuntimeError, match=r"did not learn to answer .* steps, loss \d"):
        build_memorized(tmp_path / "model", train_steps=1, check_seeds=[0])
    assert not (tmp_path / "model").exists()
