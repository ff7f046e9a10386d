"""The shipped default model completes Python in context: its answers differ with the prompt (issue 3's first
bar; how often they are right is `benchmarks/infill_eval.py`'s business)."""

from __future__ import annotations

from diffgemma_engine.loading.model import load_model
from diffgemma_engine.request.infill import run_infill
from diffgemma_engine.shared import protocol

PROMPTS = {
    "loop": ("def total(numbers):\n    result = 0\n    for n in numbers:\n        ", "\n    return result\n"),
    "string": ("def shout(text: str) -> str:\n    ", "\n"),
    "class": (
        "class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, item):\n        ",
        "",
    ),
    "guard": ("def first(items):\n    if not items:\n        ", "\n    return items[0]\n"),
}


def test_completions_differ_from_prompt_to_prompt() -> None:
    loaded = load_model(None)
    answers = {}
    for name, (prefix, suffix) in PROMPTS.items():
        text, stop, _ = run_infill(
            loaded, protocol.Infill(id=name, uri=f"file:///{name}.py", prefix=prefix, suffix=suffix, seed=0)
        )
        # a trained model ends its answer; random weights run to the end of the canvas (LENGTH)
        assert stop is protocol.StopReason.EOS, (name, text)
        answers[name] = text
    assert all(text.strip() for text in answers.values()), answers
    assert len(set(answers.values())) == len(PROMPTS), answers  # the context changes the answer
