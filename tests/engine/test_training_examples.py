"""Training examples put the cursor where typing puts it, and cut and encode the text as the engine does.

The engine serves a request whose cursor sits inside a word with a prompt that ends in a partial word's token;
an example drawn with the cursor at the same character must end its prompt with the same tokens, denoise the
canvas the engine would pick for it, and hold a middle whose tokens decode back to its text.
"""

from __future__ import annotations

import collections
import random
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from diffgemma_engine.loading.model import DEFAULT_MODEL_DIR, LoadedModel, load_model
from diffgemma_engine.request.infill import build_prompt, check_request
from diffgemma_engine.shared import protocol, vocab
from diffgemma_engine.training.data import EOS, MIDDLE_KINDS, PAD, Example, ExampleMaker

ENGINE = Path(__file__).resolve().parents[2] / "engine"
LINE_CANVAS = 16
"""The shipped model's ``line_canvas_length`` hint."""


@pytest.fixture(scope="module")
def examples() -> list[Example]:
    maker = ExampleMaker(AutoTokenizer.from_pretrained(DEFAULT_MODEL_DIR), canvas=32, line_canvas=LINE_CANVAS)
    sources = [path.read_text() for path in sorted(ENGINE.rglob("*.py")) if path.stat().st_size > 2000]
    rng = random.Random(7)
    made: list[Example] = []
    while len(made) < 600:
        example = maker.make(sources[rng.randrange(len(sources))], rng)
        if example is not None:
            made.append(example)
    return made


def _prefix_ids(ids: list[int]) -> list[int]:
    """The ids between ``<fim_prefix>`` and ``<fim_middle>`` of an SPM prompt."""
    start = len(ids) - 1 - ids[::-1].index(vocab.SPECIAL_IDS[vocab.FIM_PREFIX])
    return ids[start + 1 : -1]


def _first_line_tokens(loaded: LoadedModel, ids: list[int]) -> int:
    """How many of ``ids`` it takes to reach past the first line break (all of them for a single line)."""
    for count in range(1, len(ids) + 1):
        if "\n" in loaded.decode(ids[:count]):
            return count
    return len(ids)


def _at_a_word(example: Example) -> bool:
    """The cursor splits a word: a letter or digit on both sides."""
    return bool(example.prefix) and example.prefix[-1].isalnum() and example.middle_text[0].isalnum()


def test_the_cursor_lands_anywhere_in_lines_and_words(examples: list[Example]) -> None:
    kinds = collections.Counter(example.kind.split("/")[0] for example in examples)
    assert set(kinds) == set(MIDDLE_KINDS), kinds
    inside = [example for example in examples if example.prefix and not example.prefix.endswith("\n")]
    assert len(inside) > len(examples) // 3  # rest of line and spans: about 45% of the draws
    assert sum(map(_at_a_word, examples)) > len(examples) // 10
    assert any(not example.middle_text.endswith("\n") for example in inside)  # spans end inside lines too


def test_the_prompt_ends_with_the_tokens_the_engine_would_send(examples: list[Example]) -> None:
    loaded = load_model(DEFAULT_MODEL_DIR, "cpu", "float32")
    checked = long_enough = 0
    for example in examples:
        if example.kind.endswith("/psm"):  # the engine sends SPM; PSM examples reorder the same ids
            continue
        request = protocol.Infill(
            id="x",
            uri="file:///x.py",
            prefix=example.prefix,
            suffix=example.suffix,
            scope=protocol.cursor_scope(example.prefix),
        )
        served = build_prompt(loaded, request).ids
        trained = example.ids[: example.prompt_len]
        assert served[-1] == trained[-1] == vocab.SPECIAL_IDS[vocab.FIM_MIDDLE]
        # the prefix's tokens (after <fim_prefix>), the partial word at the cursor last. The two budgets cut the
        # far end at different line boundaries: the shorter prefix, but for its first line (at the seam a line
        # break may merge with the indentation after it, and a long indentation splits into tokens differently
        # after one), is the end of the longer
        shorter, longer = sorted((_prefix_ids(served), _prefix_ids(trained)), key=len)
        seam = max(2, _first_line_tokens(loaded, shorter))
        assert longer[len(longer) - len(shorter) + seam :] == shorter[seam:], example.prefix[-40:]
        long_enough += len(shorter) >= 16
        canvas, _ = check_request(loaded, request)
        assert example.canvas == canvas, (example.kind, example.prefix[-30:])
        checked += _at_a_word(example)
    assert checked > 20 and long_enough > 300


def test_the_canvas_holds_the_middle_then_eos_then_padding(examples: list[Example]) -> None:
    tokenizer = AutoTokenizer.from_pretrained(DEFAULT_MODEL_DIR)
    for example in examples:
        canvas = example.ids[example.prompt_len :]
        assert len(canvas) == example.canvas in (LINE_CANVAS, 32)
        middle = canvas[: canvas.index(EOS)]
        assert middle and set(canvas[len(middle) + 1 :]) <= {PAD}
        assert tokenizer.decode(middle) == example.middle_text
    assert {example.canvas for example in examples} == {LINE_CANVAS, 32}
