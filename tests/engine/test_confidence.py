"""Each canvas position's confidence, carried to the answer's characters (``Result.confidence``): the share of the
denoising steps its token has been the argmax, counted back from the last (``sampler.stable_steps``).

Real checkpoints: the memorized one is sure of ``MEMORIZED_MIDDLE`` between its prefix and suffix; the random-weight one
is sure of nothing; the shipped one, on code nobody here wrote, keeps some tokens longer than others. Real tokenizers
for the runs of characters, and a rewrite whose held tokens are certain.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import torch

from benchmarks.confidence_signals import signals, traced
from diffgemma_engine.canvas.sampler import stable_steps
from diffgemma_engine.loading.checkpoint_files import DEFAULT_MODEL_DIR
from diffgemma_engine.loading.model import LoadedModel, load_model
from diffgemma_engine.request.batch import Row, run_batch
from diffgemma_engine.request.confidence import confidence_runs, token_boundaries
from diffgemma_engine.request.infill import finish_row, run_infill
from diffgemma_engine.shared import frames, protocol
from tests.support.models import MEMORIZED_MIDDLE, MEMORIZED_PREFIX, MEMORIZED_SUFFIX


def _insertion(**fields: object) -> protocol.Infill:
    values: dict[str, object] = dict(id="c", uri="file:///a.py", prefix=MEMORIZED_PREFIX, suffix=MEMORIZED_SUFFIX)
    values.update(fields)
    return protocol.Infill(**values)  # type: ignore[arg-type]


def _per_char(runs: list[protocol.Confident]) -> list[float]:
    return [run.p for run in runs for _ in range(run.chars)]


def test_a_token_counts_the_steps_in_a_row_it_has_been_the_argmax() -> None:
    start = torch.tensor([[5, 6, 7]])  # the canvas before the first step: a position may agree with it by chance
    first = stable_steps(torch.tensor([[5, 1, 2]]), start, torch.zeros(1, 3))
    assert first.tolist() == [[1.0, 1.0, 1.0]]  # the first step counts once, agreeing or not
    second = stable_steps(torch.tensor([[5, 1, 3]]), torch.tensor([[5, 1, 2]]), first)
    assert second.tolist() == [[2.0, 2.0, 1.0]]  # kept: one more; changed its mind: counted from this step
    assert stable_steps(torch.tensor([[5]]), torch.tensor([[4]]), None).tolist() == [[1.0]]


@pytest.fixture(scope="module")
def shipped() -> LoadedModel:
    return load_model(DEFAULT_MODEL_DIR)


def test_the_engine_reports_the_share_of_the_steps_each_token_was_kept(shipped: LoadedModel) -> None:
    """The shipped model on a line of the standard library's ``textwrap`` (code nobody here wrote), traced step by
    step: what the engine reports is, per position, the share of the steps its final token has been the argmax
    (counted back from the last), not its probability at the last step (the two differ here)."""
    source = Path(textwrap.__file__).read_text(encoding="utf-8")
    at = source.index("        if self.break_on_hyphens")
    prefix, suffix = source[:at], source[source.index("\n", at) + 1 :]
    request = _insertion(prefix=prefix, suffix=suffix, seed=5, scope=protocol.cursor_scope(prefix))
    with traced() as trace:
        answer = run_infill(shipped, request)
    canvas = trace[-1][0].tolist()
    per_position = signals(trace)
    kept, last = (finish_row(shipped, canvas, None, confidence=per_position[name]) for name in ("age", "last"))
    assert answer.text and kept.text == answer.text
    assert kept.confidence != last.confidence, "the two agree here: the test would check nothing"
    assert answer.confidence == kept.confidence


def test_a_memorized_answer_is_confident_and_a_random_one_is_not(
    memorized: LoadedModel, random_weights: LoadedModel
) -> None:
    sure = run_infill(memorized, _insertion(seed=0))
    assert sure.text == MEMORIZED_MIDDLE
    assert sum(run.chars for run in sure.confidence) == len(sure.text)
    assert min(_per_char(sure.confidence)) > 0.5
    unsure = run_infill(random_weights, _insertion(seed=0, max_steps=4))
    assert unsure.text and sum(run.chars for run in unsure.confidence) == len(unsure.text)
    assert max(_per_char(unsure.confidence)) < 0.5
    assert all(0.0 <= run.p <= 1.0 and run.chars > 0 for run in [*sure.confidence, *unsure.confidence])


def test_a_rewrites_held_segment_is_certain(random_weights: LoadedModel) -> None:
    kept = "return total\n"
    segments = [protocol.StartSegment(text="x = 1\n"), protocol.StartSegment(text=kept, keep=True)]
    answer = run_infill(random_weights, _insertion(start=segments, seed=3, strength=1.0, max_steps=4))
    at = answer.text.index(kept)
    assert _per_char(answer.confidence)[at : at + len(kept)] == [1.0] * len(kept)


def test_a_batchs_rows_each_carry_their_own(memorized: LoadedModel, random_weights: LoadedModel) -> None:
    rows = [Row(request=_insertion(id=str(n)), cache_key=("c", n), should_stop=lambda: None) for n in range(2)]
    answers = run_batch(memorized, rows)
    for answer in answers:
        assert sum(run.chars for run in answer.confidence) == len(answer.text)


def test_a_cancelled_answer_has_no_confidence(memorized: LoadedModel) -> None:
    answer = run_infill(memorized, _insertion(), should_stop=lambda: "cancelled")
    assert answer.text == "" and answer.confidence == []


@pytest.mark.parametrize("text", ["def f(a, b):\n    return a + b\n", "naïve = '日本語' # ✓ 🙂\n", "\t\t  \n\n"])
def test_the_runs_cover_the_text_with_each_tokenizer(
    memorized: LoadedModel, release_tokenizer: object, text: str
) -> None:
    for tokenizer in (memorized.tokenizer, release_tokenizer):
        tokens = tokenizer.encode(text, add_special_tokens=False)  # type: ignore[attr-defined]

        def decode(ids: list[int], tokenizer: object = tokenizer) -> str:
            return tokenizer.decode(ids, skip_special_tokens=True)  # type: ignore[attr-defined,no-any-return]

        assert decode(tokens) == text
        ends = token_boundaries(decode, tokens, text)
        assert ends[-1] == len(text) and ends == sorted(ends)
        confidence = [index / len(tokens) for index in range(len(tokens))]
        runs = confidence_runs(decode, tokens, confidence, text)
        assert sum(run.chars for run in runs) == len(text)
        assert _per_char(runs) == sorted(_per_char(runs))  # the tokens' order, each character its own token's


def test_a_character_of_several_tokens_takes_the_lowest_of_them() -> None:
    pieces = {1: "a", 2: "", 3: "é", 4: "b"}  # token 2 makes no character on its own: half of the é

    def decode(ids: list[int]) -> str:
        return "".join(pieces[token] for token in ids)

    runs = confidence_runs(decode, [1, 2, 3, 4], [0.9, 0.2, 0.8, 0.7], "aéb")
    assert runs == [
        protocol.Confident(chars=1, p=0.9),
        protocol.Confident(chars=1, p=0.2),
        protocol.Confident(chars=1, p=0.7),
    ]


def test_the_wire_carries_the_runs_and_an_old_engines_result_has_none() -> None:
    result = protocol.Result(
        id="a", text="ab", stop=protocol.StopReason.EOS, confidence=[protocol.Confident(chars=2, p=0.25)]
    )
    assert frames.decode(frames.encode(result)[4:]) == result
    old = b'{"type": "result", "id": "a", "text": "ab", "stop": "eos"}'
    assert frames.decode(old) == protocol.Result(id="a", text="ab", stop=protocol.StopReason.EOS)
