"""Rewrites: a canvas that starts from the selection, part-way down its schedule, with some of it held fixed.

Real checkpoints throughout: the memorized one answers ``MEMORIZED_MIDDLE`` between its prefix and suffix, the
random-weight ones never settle, so every step of a schedule runs and nothing but the engine holds a token.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from transformers import DiffusionGemmaForBlockDiffusion

from diffgemma_engine.canvas.clock import StepClock
from diffgemma_engine.canvas.compiled import DecoderStep
from diffgemma_engine.canvas.denoise import run_canvas
from diffgemma_engine.canvas.sampler import SamplerSettings, Scores
from diffgemma_engine.canvas.start import StartCanvas, renoise_start, start_step
from diffgemma_engine.errors import BadRequestError
from diffgemma_engine.loading.model import LoadedModel, load_model
from diffgemma_engine.request.batch import Row, compatible, run_batch
from diffgemma_engine.request.infill import budget_steps, build_prompt, check_request, cut_at_eos, run_infill, start_row
from diffgemma_engine.shared import protocol
from tests.support.models import MEMORIZED_MIDDLE, MEMORIZED_PREFIX, MEMORIZED_SUFFIX

WRONG_MIDDLE = MEMORIZED_MIDDLE.replace("a + b", "a - b")
"""The memorized middle with one token changed (`` +`` to `` -``)."""


def rewrite(start: str | list[protocol.StartSegment] = WRONG_MIDDLE, **fields: object) -> protocol.Infill:
    segments = [protocol.StartSegment(text=start)] if isinstance(start, str) else start
    values: dict[str, object] = dict(
        id="r", uri="file:///a.py", prefix=MEMORIZED_PREFIX, suffix=MEMORIZED_SUFFIX, seed=0, strength=0.5
    )
    values.update(fields)
    return protocol.Infill(start=segments, **values)  # type: ignore[arg-type]


def insertion(**fields: object) -> protocol.Infill:
    values: dict[str, object] = dict(id="i", uri="file:///a.py", prefix=MEMORIZED_PREFIX, suffix=MEMORIZED_SUFFIX)
    values.update(fields)
    return protocol.Infill(**values)  # type: ignore[arg-type]


def test_the_corrupted_middle_differs_from_the_memorized_one_by_one_token(memorized: LoadedModel) -> None:
    right, wrong = (
        memorized.tokenizer.encode(text, add_special_tokens=False) for text in (MEMORIZED_MIDDLE, WRONG_MIDDLE)
    )
    assert len(right) == len(wrong) and sum(a != b for a, b in zip(right, wrong, strict=True)) == 1


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_a_rewrite_of_a_corrupted_middle_returns_the_memorized_middle(memorized: LoadedModel, seed: int) -> None:
    text, stop, timings = run_infill(memorized, rewrite(seed=seed))
    assert text == MEMORIZED_MIDDLE
    assert stop is protocol.StopReason.EOS
    assert 1 <= timings.steps <= start_step(0.5, memorized.sampler.max_steps) < memorized.sampler.max_steps


def test_a_light_touch_runs_fewer_steps_than_from_noise(memorized: LoadedModel) -> None:
    """From noise the memorized model settles after two steps (its stopping rule needs two equal canvases), the
    fewest a whole schedule runs; half of a two-step schedule is one step, and it still answers."""
    text, _, from_noise = run_infill(memorized, insertion(seed=0, max_steps=2))
    assert text == MEMORIZED_MIDDLE and from_noise.steps == 2
    text, _, whole = run_infill(memorized, rewrite(max_steps=2, strength=1.0))
    assert text == MEMORIZED_MIDDLE and whole.steps == 2
    for seed in range(4):
        text, stop, light = run_infill(memorized, rewrite(max_steps=2, seed=seed))
        assert (text, stop, light.steps) == (MEMORIZED_MIDDLE, protocol.StopReason.EOS, 1)


@pytest.mark.parametrize(("strength", "steps"), [(1.0, 8), (0.75, 6), (0.5, 4), (0.3, 3), (0.1, 1)])
def test_the_schedule_starts_at_the_step_that_matches_the_strength(
    random_weights: LoadedModel, strength: float, steps: int
) -> None:
    """Random weights never settle, so every step from ``ceil(strength * 8)`` down to 1 runs."""
    assert random_weights.sampler.max_steps == 8
    _, stop, timings = run_infill(random_weights, rewrite(strength=strength))
    assert stop is protocol.StopReason.LENGTH or stop is protocol.StopReason.EOS
    assert timings.steps == steps == start_step(strength, 8)
    _, _, from_noise = run_infill(random_weights, insertion(strength=strength))  # no start: strength has no say
    assert from_noise.steps == 8


def test_the_temperatures_are_the_schedules_own_from_the_matching_step(random_weights: LoadedModel) -> None:
    """A rewrite at 0.5 runs steps 4..1 of 8 at those steps' temperatures, not a fresh 4-step schedule."""
    seen: list[float] = []

    class Recording(DecoderStep):
        def __call__(self, *args: Any) -> Scores:
            seen.append(float(args[-1]))
            return super().__call__(*args)

    settings = random_weights.sampler
    prompt = torch.tensor([build_prompt(random_weights, rewrite()).ids])
    row = start_row(random_weights, rewrite(), 32)
    assert row is not None
    start = StartCanvas(tokens=torch.tensor([row.tokens]), strength=0.5)
    run_canvas(random_weights.model, prompt, 32, settings, step=Recording(random_weights.model), start=start)
    expected = [settings.t_min + (settings.t_max - settings.t_min) * step / 8 for step in (4, 3, 2, 1)]
    assert seen == pytest.approx(expected)


HELD_HEAD = "def add(a, b):\n"
HELD_TAIL = "\n# the end of add\n"


@pytest.mark.parametrize(
    ("fixture", "strength"), [("random_model_dir", 1.0), ("random_model_dir", 0.4), ("release_random_dir", 0.2)]
)
def test_held_segments_come_back_unchanged_on_random_weights(
    fixture: str, strength: float, request: pytest.FixtureRequest
) -> None:
    """Nothing in random weights keeps a token: the engine holds them (the release format's end-of-sequence set,
    1, 106 and 50, included)."""
    loaded = load_model(request.getfixturevalue(fixture))
    segments = [
        protocol.StartSegment(text=HELD_HEAD, keep=True),
        protocol.StartSegment(text="    return a - b"),
        protocol.StartSegment(text=HELD_TAIL, keep=True),
    ]
    for seed in range(3):
        text, _, _ = run_infill(loaded, rewrite(segments, prefix="", suffix="", seed=seed, strength=strength))
        assert text.startswith(HELD_HEAD), text
        assert HELD_TAIL in text[len(HELD_HEAD) :], text
    # and with candidates: one batch of rows that share the start
    row = Row(request=rewrite(segments, seed=None, strength=strength), cache_key=(0, "u"), should_stop=lambda: None)
    for text, _, _ in run_batch(loaded, [row] * 3):
        assert text.startswith(HELD_HEAD) and HELD_TAIL in text[len(HELD_HEAD) :], text


def test_a_seeded_rewrite_reproduces(random_weights: LoadedModel) -> None:
    text, stop, timings = run_infill(random_weights, rewrite(seed=7))
    again, again_stop, again_timings = run_infill(random_weights, rewrite(seed=7))
    assert (again, again_stop, again_timings.steps) == (text, stop, timings.steps)
    assert run_infill(random_weights, rewrite(seed=8))[0] != text  # random weights: another draw, other text


def test_a_rewrite_runs_alone_but_its_candidates_share_a_batch(memorized: LoadedModel) -> None:
    assert not compatible(rewrite(seed=None), insertion(), memorized)
    assert not compatible(insertion(), rewrite(seed=None), memorized)
    assert not compatible(rewrite(seed=None), rewrite(seed=None), memorized)
    assert compatible(insertion(), insertion(), memorized)
    row = Row(request=rewrite(seed=None), cache_key=(0, "u"), should_stop=lambda: None)
    results = run_batch(memorized, [row] * 3)
    assert [text for text, _, _ in results] == [MEMORIZED_MIDDLE] * 3
    assert all(timings.steps <= start_step(0.5, memorized.sampler.max_steps) for _, _, timings in results)


def test_the_fim_prompt_of_a_rewrite_is_the_insertions(memorized: LoadedModel) -> None:
    """The FIM layout has no place for the selection or an instruction: the canvas carries the selection."""
    ids = build_prompt(memorized, rewrite(instruction="Fix the operator.")).ids
    assert ids == build_prompt(memorized, insertion()).ids


def test_the_start_canvas_is_laid_out_as_training_lays_out_a_middle(memorized: LoadedModel) -> None:
    segments = [
        protocol.StartSegment(text="    total = a + b\n", keep=True),
        protocol.StartSegment(text="    return total"),
    ]
    row = start_row(memorized, rewrite(segments), 32)
    assert row is not None
    head = memorized.tokenizer.encode("    total = a + b\n", add_special_tokens=False)
    tail = memorized.tokenizer.encode("    return total", add_special_tokens=False)
    eos, pad = memorized.tokenizer.eos_token_id, memorized.tokenizer.pad_token_id
    assert row.tokens == [*head, *tail, eos, *[pad] * (32 - len(head) - len(tail) - 1)]
    assert row.held == [True] * len(head) + [False] * (32 - len(head))
    assert row.held_until == len(head)
    assert start_row(memorized, insertion(), 32) is None


def test_a_selection_longer_than_a_canvas_is_refused(memorized: LoadedModel) -> None:
    with pytest.raises(BadRequestError, match=r"the selection is \d+ tokens, more than one canvas of 32 .*select less"):
        start_row(memorized, rewrite("x = 1\n" * 20), 32)
    with pytest.raises(BadRequestError, match=r"the selection is 5000 characters, .*select less"):
        start_row(memorized, rewrite("x" * 5000), 32)
    assert start_row(memorized, rewrite("x = 1\n" * 2), 32) is not None


@pytest.mark.parametrize("strength", [0.0, -0.5, 1.01, math.nan, math.inf])
def test_a_strength_outside_zero_to_one_is_refused(memorized: LoadedModel, strength: float) -> None:
    with pytest.raises(BadRequestError, match="strength must be more than 0 and at most 1, got"):
        check_request(memorized, rewrite(strength=strength))


def test_an_instruction_over_the_cap_is_refused(memorized: LoadedModel) -> None:
    check_request(memorized, rewrite(instruction="x" * protocol.MAX_INSTRUCTION_CHARS))
    with pytest.raises(
        BadRequestError, match=f"the instruction is 2001 characters, more than {protocol.MAX_INSTRUCTION_CHARS}"
    ):
        check_request(memorized, rewrite(instruction="x" * (protocol.MAX_INSTRUCTION_CHARS + 1)))


def test_an_end_of_sequence_before_a_held_token_does_not_cut_it() -> None:
    eos, pad = {1}, 0
    assert cut_at_eos([5, 1, 6, 7, 1, 8], eos, pad) == ([5], True)
    assert cut_at_eos([5, 1, 6, 7, 1, 8], eos, pad, held_until=4) == ([5, 6, 7], True)
    assert cut_at_eos([5, 0, 1, 6, 9], eos, pad, held_until=4) == ([5, 6, 9], False)


def test_a_deadline_shortens_the_schedule_so_that_its_share_fits() -> None:
    clock = StepClock()
    assert budget_steps(clock, 32, 16, 0.5, 1.0) == 16  # no estimate yet
    clock.observe(32, encode_ms=0.0, denoise_ms=100.0, steps=10)  # 10 ms a step
    assert budget_steps(clock, 32, 16, 1.0, 45.0) == clock.step_budget(32, 16, 45.0) == 4  # an insertion, as before
    assert budget_steps(clock, 32, 16, 0.5, 95.0) == 16  # its 8 steps fit
    shorter = budget_steps(clock, 32, 16, 0.5, 45.0)
    assert (shorter, start_step(0.5, shorter)) == (8, 4)


def test_renoising_changes_the_share_of_free_positions_and_never_a_held_one() -> None:
    tokens = torch.arange(100, 164).reshape(2, 32)
    fixed = torch.zeros(2, 32, dtype=torch.bool)
    fixed[:, :8] = True
    fixed[1, 8:16] = True
    for strength, counts in ((1.0, [24, 16]), (0.5, [12, 8]), (0.1, [3, 2])):
        start = StartCanvas(tokens=tokens, fixed=fixed, strength=strength)
        canvas = renoise_start(start, 50_000, torch.Generator().manual_seed(0))
        assert torch.equal(canvas[fixed], tokens[fixed])
        assert (canvas != tokens).sum(dim=-1).tolist() == counts
        again = renoise_start(start, 50_000, torch.Generator().manual_seed(0))
        assert torch.equal(canvas, again)


def test_start_step_is_the_ceiling_of_strength_times_steps() -> None:
    assert [start_step(s, 16) for s in (1.0, 0.5, 0.51, 0.01)] == [16, 8, 9, 1]
    assert start_step(0.7, 10) == 7 and start_step(1 / 3, 48) == 16


@pytest.mark.parametrize("fixture", ["random_model_dir", "memorized_model_dir"])
@pytest.mark.parametrize("seed", [0, 1])
def test_a_rewrite_denoises_as_generate_does_from_the_same_start(
    fixture: str, seed: int, request: pytest.FixtureRequest
) -> None:
    """From a start, the loop is ``generate``'s from ``decoder_input_ids``, on the matching part of the schedule.

    Half of an 8-step schedule from 0.5 to 1.0 runs steps 4..1 at temperatures 0.75 .. 0.5625, which is a 4-step
    ``generate`` from 0.5 to 0.75 (binary fractions, so the temperatures are equal to the bit). ``generate`` draws
    a canvas of its own even when given one (``initialize_canvas``, then dropped): its random stream is set to where
    the engine's stood before it drew the noise, so that this draw is the noise and the streams meet after it.
    """
    model_dir = request.getfixturevalue(fixture)
    loaded = load_model(model_dir, dtype="float32")
    model = DiffusionGemmaForBlockDiffusion.from_pretrained(model_dir).eval()
    config = model.generation_config
    settings = SamplerSettings(
        max_steps=8,
        t_min=0.5,
        t_max=1.0,
        entropy_bound=config.sampler_config.entropy_bound,
        stability_threshold=config.stability_threshold,
        confidence_threshold=config.confidence_threshold,
        exact=True,
    )
    prompt = torch.tensor([build_prompt(loaded, rewrite()).ids])
    row = start_row(loaded, rewrite(), model.config.canvas_length)
    assert row is not None
    start = StartCanvas(tokens=torch.tensor([row.tokens]), strength=0.5)
    ours = run_canvas(
        model, prompt, model.config.canvas_length, settings, torch.Generator().manual_seed(seed), start=start
    )

    first = renoise_start(
        start, model.config.get_text_config(decoder=True).vocab_size, torch.Generator().manual_seed(seed)
    )
    before_noise = torch.Generator().manual_seed(seed)
    torch.rand(first.shape, generator=before_noise)  # renoise_start's first draw: which positions
    torch.set_rng_state(before_noise.get_state())
    reference = model.generate(
        input_ids=prompt,
        max_new_tokens=model.config.canvas_length,
        decoder_input_ids=first,
        max_denoising_steps=4,
        t_min=0.5,
        t_max=0.75,
    ).sequences[0, prompt.shape[1] :]
    eos, pad = set(config.eos_token_id), config.pad_token_id
    assert cut_at_eos(ours.tokens[0].tolist(), eos, pad) == cut_at_eos(reference.tolist(), eos, pad)
    assert ours.steps <= 4
