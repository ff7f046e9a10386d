"""The capturable denoising step (``diffgemma_engine.canvas.static``): no host synchronisation inside it, an operator
budget at the release's layer structure, and the eager exact loop's tokens, eager or compiled as one graph."""

from __future__ import annotations

import pytest
import torch
from transformers import DiffusionGemmaForBlockDiffusion, DynamicCache

from benchmarks.gpu_shape import STRUCTURE, build
from diffgemma_engine.canvas.caches import encode_prompt, stack_rows
from diffgemma_engine.canvas.compiled import DecoderStep
from diffgemma_engine.canvas.denoise import denoise_canvas
from diffgemma_engine.canvas.loop import Denoised
from diffgemma_engine.canvas.sampler import SamplerSettings, StepNoise, sample_accepted
from diffgemma_engine.canvas.start import StartCanvas
from diffgemma_engine.canvas.static import StaticPrompt, compile_step, denoise_static, exact_step, prompt_bucket
from diffgemma_engine.canvas.step import initial_state
from diffgemma_engine.loading.model import load_model
from tests.support.host_sync import OperatorLog

EXACT = SamplerSettings(max_steps=16, exact=True)
STEP_OPERATOR_BUDGET = 6000
"""Operators one step may dispatch at the release's layer structure (5,541 measured: the decoder with the grouped
experts, then the sampler). The experts' Python loop (``experts_implementation="eager"``) takes over 60,000."""


@pytest.fixture(scope="module")
def shipped() -> DiffusionGemmaForBlockDiffusion:
    torch.manual_seed(0)
    return load_model(None).model


@pytest.fixture(scope="module")
def structure() -> DiffusionGemmaForBlockDiffusion:
    torch.manual_seed(0)
    return build(STRUCTURE, torch.device("cpu"), torch.float32)


def _encoded(model: DiffusionGemmaForBlockDiffusion, length: int, seed: int = 0) -> DynamicCache:
    """A decoder view of a random prompt of ``length`` tokens (sliding layers windowed, as the engine's)."""
    vocab = model.config.get_text_config().vocab_size
    ids = torch.randint(10, vocab - 10, (1, length), generator=torch.Generator().manual_seed(seed))
    cache = DynamicCache(config=model.config.get_text_config(decoder=True))
    with torch.inference_mode():
        encode_prompt(model, ids, cache)
    return cache


def _static(
    model: DiffusionGemmaForBlockDiffusion, views: list[DynamicCache], canvas: int, seed: int, **kwargs: object
) -> Denoised:
    bucket = prompt_bucket(max(view.get_seq_length() for view in views))
    prompt = StaticPrompt.allocate(model, views[0], len(views), bucket, canvas)
    prompt.load(views)
    return denoise_static(model, prompt, EXACT, torch.Generator().manual_seed(seed), **kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(("length", "canvas"), [(20, 32), (20, 16), (700, 32)], ids=["canvas", "line", "window"])
def test_the_static_loop_gives_the_eager_exact_tokens(
    shipped: DiffusionGemmaForBlockDiffusion, length: int, canvas: int
) -> None:
    """Same seed, same tokens and steps: a short prompt in a 256-slot bucket (its empty slots masked), the line
    canvas, and a prompt past the sliding window (512: the sliding layers' buffers hold its last 511 tokens)."""
    view = _encoded(shipped, length)
    for seed in range(3):
        with torch.inference_mode():
            eager = denoise_canvas(shipped, view, 1, canvas, EXACT, torch.Generator().manual_seed(seed))
        static = _static(shipped, [view], canvas, seed)
        assert torch.equal(static.tokens, eager.tokens), seed
        assert (static.steps, static.row_steps) == (eager.steps, eager.row_steps)


def test_a_batch_of_prompts_of_different_lengths_is_one_shape(shipped: DiffusionGemmaForBlockDiffusion) -> None:
    views = [_encoded(shipped, 20, seed=1), _encoded(shipped, 90, seed=2)]
    cache, positions, mask = stack_rows(views, shipped.config.get_text_config(decoder=True), 32)
    with torch.inference_mode():
        eager = denoise_canvas(
            shipped, cache, 2, 32, EXACT, torch.Generator().manual_seed(5), position_ids=positions, decoder_mask=mask
        )
    static = _static(shipped, views, 32, 5)
    assert torch.equal(static.tokens, eager.tokens)
    assert static.row_steps == eager.row_steps


def test_a_rewrite_keeps_its_held_positions(shipped: DiffusionGemmaForBlockDiffusion) -> None:
    view = _encoded(shipped, 40)
    tokens = torch.randint(10, 8000, (1, 32), generator=torch.Generator().manual_seed(3))
    fixed = torch.zeros((1, 32), dtype=torch.bool)
    fixed[0, :6] = fixed[0, 20:] = True
    start = StartCanvas(tokens=tokens, fixed=fixed, strength=0.6)
    with torch.inference_mode():
        eager = denoise_canvas(shipped, view, 1, 32, EXACT, torch.Generator().manual_seed(4), start=start)
    static = _static(shipped, [view], 32, 4, start=start)
    assert torch.equal(static.tokens, eager.tokens)
    assert torch.equal(static.tokens[fixed], tokens[fixed])
    assert static.steps == eager.steps <= 10  # the schedule starts at step ceil(0.6 * 16)


def test_cancel_and_row_checks_are_answered_between_steps(shipped: DiffusionGemmaForBlockDiffusion) -> None:
    views = [_encoded(shipped, 20, seed=1), _encoded(shipped, 30, seed=2)]
    steps_seen: list[int] = []
    cancelled = _static(
        shipped,
        views,
        32,
        0,
        should_stop=lambda: "cancelled" if len(steps_seen) == 3 else None,
        on_step=steps_seen.append,
    )
    assert cancelled.stopped_by == "cancelled" and cancelled.steps == 3 and steps_seen == [1, 2, 3]
    seen: list[int] = []
    late = _static(
        shipped,
        views,
        32,
        0,
        on_step=seen.append,
        row_checks=[lambda: None, lambda: "deadline" if len(seen) == 2 else None],
    )
    assert late.row_stops == [None, "deadline"] and late.row_steps[1] == 2 and late.row_steps[0] > 2
    assert bool(late.finished[1])


def test_a_prompt_longer_than_its_bucket_is_refused(shipped: DiffusionGemmaForBlockDiffusion) -> None:
    view = _encoded(shipped, 300)
    prompt = StaticPrompt.allocate(shipped, view, 1, 256, 32)
    with pytest.raises(ValueError, match="300 tokens does not fit a capacity of 256"):
        prompt.load([view])
    with pytest.raises(ValueError, match="2 prompts for a batch of 1"):
        prompt.load([view, view])
    assert [prompt_bucket(n) for n in (1, 256, 257, 700, 1024, 1025)] == [256, 256, 512, 1024, 1024, 2048]


def _one_step(model: DiffusionGemmaForBlockDiffusion, canvas: int = 32) -> OperatorLog:
    """The operators of one static step (its second: self-conditioning on) at ``model``'s structure."""
    vocab = model.config.get_text_config().vocab_size
    view = _encoded(model, 100)
    prompt = StaticPrompt.allocate(model, view, 1, prompt_bucket(100), canvas)
    prompt.load([view])
    step = exact_step(model, EXACT)
    with torch.inference_mode():
        state = initial_state(1, canvas, vocab, EXACT, torch.float32, torch.device("cpu"), None)
        state = step(prompt, state, StepNoise.draw(1, canvas, vocab, torch.device("cpu"), None))
        noise = StepNoise.draw(1, canvas, vocab, torch.device("cpu"), None)
        log = OperatorLog()
        with log:
            step(prompt, state, noise)
    return log


def test_the_step_never_waits_for_the_host(structure: DiffusionGemmaForBlockDiffusion) -> None:
    """No operator inside the step reads a device value back; the engine's eager step does (the detector sees the
    accepted positions' ``nonzero``), which is what this step replaces."""
    assert dict(_one_step(structure).syncs) == {}
    view = _encoded(structure, 100)
    eager = DecoderStep(structure)
    canvas = torch.randint(0, 500, (1, 32))
    with torch.inference_mode():
        mask = structure.model.decoder.create_diffusion_decoder_attention_mask(
            config=structure.config,
            inputs_embeds=canvas.unsqueeze(-1),
            cache=view,
            decoder_attention_mask=torch.ones((1, 132), dtype=torch.bool),
        )
        log = OperatorLog()
        with log:
            scores = eager(canvas, torch.zeros(1, 32, 512), mask, view, torch.arange(100, 132)[None], torch.tensor(0.5))
            sample_accepted(scores, canvas, 0.1, None)
    assert "aten.nonzero_numpy.default" in log.syncs


def test_the_step_stays_within_its_operator_budget(structure: DiffusionGemmaForBlockDiffusion) -> None:
    grouped = _one_step(structure)
    assert grouped.total <= STEP_OPERATOR_BUDGET, grouped.counts.most_common(10)
    structure.set_experts_implementation("eager")  # a Python loop over the experts: the budget must catch it
    try:
        looped = _one_step(structure)
    finally:
        structure.set_experts_implementation("grouped_mm")
    assert looped.total > 10 * STEP_OPERATOR_BUDGET and looped.syncs


@pytest.mark.parametrize("canvas", [32, 16], ids=["canvas", "line"])
def test_the_step_compiles_as_one_graph_with_the_eager_tokens(
    shipped: DiffusionGemmaForBlockDiffusion, canvas: int
) -> None:
    """``fullgraph``: one host read or data-dependent shape anywhere in the step (``tolist`` too, which no dispatch
    mode sees) fails the compile. The graph's answers are the eager step's, on the serving shapes."""
    compiled = compile_step(shipped, EXACT)
    view = _encoded(shipped, 60)
    for seed in range(2):
        eager = _static(shipped, [view], canvas, seed)
        graph = _static(shipped, [view], canvas, seed, step=compiled)
        assert torch.equal(graph.tokens, eager.tokens) and graph.steps == eager.steps
