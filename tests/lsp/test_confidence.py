"""The model's confidence in each character, carried through post-processing (``postprocess.confidence``), and the
rule that cuts a suggestion to its sure part or withholds it, and refuses an unsure rewrite.

Every filter of the pipeline and of the replacement's pipeline hands the confidences on (``Scored.then``): checked on
hand-made cases where each filter changes the text, and as a property over arbitrary outputs (hypothesis), and over
code nobody here wrote (the standard library's own modules, cut at random places).
"""

from __future__ import annotations

import random
import sysconfig
from pathlib import Path

import attrs
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from diffgemma_engine.shared import protocol
from diffgemma_lsp.postprocess import Edit, infill_edits, postprocess
from diffgemma_lsp.postprocess.confidence import (
    Scored,
    carry,
    confident_part,
    per_character,
    unsure_replacement,
    why_refused,
    why_withheld,
)
from diffgemma_lsp.postprocess.pipeline import gated
from diffgemma_lsp.postprocess.replacement import scored_replacement

LOW, HIGH = 0.1, 0.9


def _marked(text: str, unsure: str) -> tuple[float, ...]:
    """HIGH for every character of ``text`` but those of the first ``unsure`` in it, LOW there."""
    at = text.index(unsure)
    return tuple(LOW if at <= index < at + len(unsure) else HIGH for index in range(len(text)))


def _unsure_chars(text: str, confidence: tuple[float, ...] | None) -> str:
    assert confidence is not None and len(confidence) == len(text)
    return "".join(char for char, p in zip(text, confidence, strict=True) if p == LOW)


def test_the_runs_of_the_wire_become_one_confidence_per_character() -> None:
    runs = [protocol.Confident(chars=2, p=0.5), protocol.Confident(chars=1, p=0.25)]
    assert per_character("abc", runs) == (0.5, 0.5, 0.25)
    assert per_character("abcd", runs) is None  # not the text's: not known, never gated on
    assert per_character("abc", []) is None


def test_carry_keeps_each_kept_character_its_own_and_a_rewritten_one_the_lowest_it_replaced() -> None:
    assert carry("abcdef", "cdef", (1, 2, 3, 4, 5, 6)) == (3, 4, 5, 6)
    assert carry("  x = 1\n", "\tx = 1\n", (5, 4, 9, 9, 9, 9, 9, 9)) == (4, 9, 9, 9, 9, 9, 9)
    assert carry("a\nb", "a\r\nb", (7, 3, 8)) == (7, 3, 3, 8)  # the line break rewritten: the \r takes the \n's
    assert carry("ab", "aXb", (0.5, 0.7)) == (0.5, 0.7, 0.7)  # an added character: the one it goes before
    assert carry("ab", "ab)", (0.5, 0.7)) == (0.5, 0.7, 0.7)  # at the end: the last one's


def test_reindenting_and_cutting_at_the_suffix_keep_the_unsure_word_on_its_characters() -> None:
    prefix = "class A:\n    def f(self, xs):\n"
    suffix = "\n    def g(self):\n        pass\n"
    raw = "    total = sum(xs)\n    return total\n\n    def g(self):\n        pass\n"  # runs on into g
    edit = postprocess(prefix, suffix, raw, "python", confidence=_marked(raw, "sum"))
    assert edit is not None and edit.text == "        total = sum(xs)\n    return total"  # the first line fitted
    assert _unsure_chars(edit.text, edit.confidence) == "sum"


def test_an_instruct_answers_fence_and_echo_go_with_their_confidences() -> None:
    prefix, suffix = "def add(a, b):\n", "\n"
    raw = "Here it is:\n```python\ndef add(a, b):\n    return a + b\n```\nDone."
    edit = postprocess(prefix, suffix, raw, "python", instruct=True, confidence=_marked(raw, "a + b"))
    assert edit is not None and edit.text == "    return a + b"
    assert _unsure_chars(edit.text, edit.confidence) == "a + b"


def test_a_replacement_carries_them_to_the_selections_place_and_line_endings() -> None:
    prefix, selection, suffix = "def f(x):\r\n", "    y = x\r\n    return y\r\n", "\r\nprint(f(1))\r\n"
    raw = "y = x * 2\nreturn y\n"
    scored = scored_replacement(prefix, selection, suffix, Scored(raw, _marked(raw, "* 2")), "python")
    assert scored is not None and scored.text == "    y = x * 2\r\n    return y\r\n"
    assert _unsure_chars(scored.text, scored.confidence) == "* 2"


PIECES = [*"ab_x1 \t()[]{}'\";:#", "\n", "\r\n", "    ", "def ", "return ", "if x:", "end", '"""', "/*", "*/"]


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    prefix=st.lists(st.sampled_from(PIECES), max_size=12).map("".join),
    suffix=st.lists(st.sampled_from(PIECES), max_size=12).map("".join),
    raw=st.lists(st.sampled_from(PIECES), max_size=20).map("".join),
    language=st.sampled_from(["python", "javascript", "go", "lua", ""]),
    instruct=st.booleans(),
)
def test_every_edit_has_one_confidence_per_character_drawn_from_the_raw_ones(
    prefix: str, suffix: str, raw: str, language: str, instruct: bool
) -> None:
    confidence = tuple((index % 7) / 7 for index in range(len(raw)))
    edit = postprocess(prefix, suffix, raw, language, instruct=instruct, confidence=confidence)
    if edit is not None:
        assert edit.confidence is not None and len(edit.confidence) == len(edit.text)
        assert set(edit.confidence) <= set(confidence)
        assert postprocess(prefix, suffix, raw, language, instruct=instruct) == attrs.evolve(edit, confidence=None)


def _stdlib_files() -> list[Path]:
    root = Path(sysconfig.get_paths()["stdlib"])
    return sorted(path for path in root.glob("*.py") if path.stat().st_size > 2000)[:40]


def test_over_the_standard_librarys_code_the_unsure_word_stays_on_its_characters() -> None:
    """Code nobody here wrote: a cursor at the start of a random line of a standard-library module, the next lines
    as the model's answer with one word marked unsure, the rest after them as the suffix. Wherever the word survives
    post-processing it is still the unsure one, and no other character is (whitespace aside: indentation added
    before it takes its confidence)."""
    chooser = random.Random(45)
    checked = 0
    for path in _stdlib_files():
        lines = path.read_text(encoding="utf-8", errors="replace").split("\n")
        for _ in range(5):
            at = chooser.randrange(1, max(2, len(lines) - 6))
            raw = "\n".join(lines[at : at + 4]) + "\n"
            words = [word for word in raw.split() if word.isidentifier() and len(word) > 3]
            if not words:
                continue
            word = chooser.choice(words)
            prefix, suffix = "\n".join(lines[:at]) + "\n", "\n".join(lines[at + 4 :])
            edit = postprocess(prefix, suffix, raw, "python", confidence=_marked(raw, word))
            if edit is None:
                continue
            unsure = "".join(_unsure_chars(edit.text, edit.confidence).split())  # indentation added takes the line's
            assert unsure in ("", word) or word.startswith(unsure), (path.name, at, word, unsure)
            checked += 1
    assert checked > 100


def test_a_suggestion_is_cut_before_its_first_unsure_word_and_withheld_when_it_starts_unsure() -> None:
    text = "total = compute(values)\nreturn total"
    assert confident_part(Scored(text, _marked(text, "pute")), 0.5) == Scored("total =", _marked(text, "pute")[:7])
    assert confident_part(Scored(text, _marked(text, "tot")), 0.5) is None  # its first word is unsure: withheld
    assert confident_part(Scored(text, _marked(text, "tot")), 0.0) == Scored(text, _marked(text, "tot"))  # off
    assert confident_part(Scored(text), 0.5) == Scored(text)  # not known: shown whole
    spaces = "    x = 1"
    assert confident_part(Scored(spaces, _marked(spaces, "  ")), 0.5) == Scored(spaces, _marked(spaces, "  "))


def test_an_unsure_rewrite_is_refused_with_its_confidence() -> None:
    noise = "total_:"
    assert unsure_replacement(Scored(noise, (0.2,) * len(noise)), 0.4) == pytest.approx(0.2)
    assert unsure_replacement(Scored(noise, (0.9,) * len(noise)), 0.4) is None
    assert unsure_replacement(Scored(noise), 0.4) is None  # not known: applied as before


def test_a_gated_edit_replaces_nothing_past_the_cursor_once_cut_and_says_why_when_withheld() -> None:
    text = "print(value, other))"
    edit = Edit(text=text, replace_to_eol=True, confidence=_marked(text, "other"))
    assert gated(edit, 0.5) == Edit(text="print(value,", replace_to_eol=False, confidence=_marked(text, "other")[:12])
    assert gated(edit, 0.05) is edit  # sure enough: whole, still replacing the closers
    unsure = Edit(text=text, replace_to_eol=True, confidence=_marked(text, "print"))
    assert gated(unsure, 0.5) is None
    assert why_withheld(unsure.scored, 0.5) == (
        "the model is unsure of how this suggestion starts (confidence 0.10, under minConfidence 0.5): nothing shown"
    )
    assert why_withheld(edit.scored, 0.5) is None  # cut, not withheld


def test_an_unsure_rewrite_says_why_it_was_not_applied() -> None:
    noise = Scored("total_:", (0.25,) * 7)
    assert why_refused(noise, 0.4) == (
        "the rewrite was not applied: the model is unsure of it (confidence 0.25 on average, under minConfidence 0.4);"
        " the code is left as it was"
    )
    assert why_refused(noise, 0.2) is None


def test_the_confidences_are_carried_only_when_the_gate_or_the_ghost_text_reads_them() -> None:
    prefix, suffix = "def f(x):\n", "\n"
    raw = "    return x + 1\n\n\n"
    result = protocol.Result(
        id="a", text=raw, stop=protocol.StopReason.EOS, confidence=[protocol.Confident(chars=len(raw), p=0.9)]
    )
    off, on = (infill_edits(protocol.Layout.FIM, _request(prefix, suffix), result, "python", m) for m in (0.0, 0.5))
    assert off[0] is not None and on[0] is not None and off[0].text == on[0].text == "    return x + 1"
    assert off[0].confidence is None  # minConfidence 0: nothing reads them, so no step carries them
    assert on[0].confidence == (0.9,) * len(on[0].text)
    [shown] = infill_edits(protocol.Layout.FIM, _request(prefix, suffix), result, "python", 0.0, scored=True)
    assert shown is not None and shown.confidence == (0.9,) * len(shown.text)  # ghost text: the editor reads them


def test_the_answer_says_why_its_best_candidate_is_withheld_only_when_it_is() -> None:
    prefix, suffix = "def f(x):\n", "\n"
    raw = "    return x + 1\n"
    unsure_start = [protocol.Confident(chars=8, p=0.1), protocol.Confident(chars=len(raw) - 8, p=0.9)]
    for confidence, withheld in (([protocol.Confident(chars=len(raw), p=0.9)], None), (unsure_start, "unsure")):
        result = protocol.Result(id="a", text=raw, stop=protocol.StopReason.EOS, confidence=confidence)
        edits = infill_edits(protocol.Layout.FIM, _request(prefix, suffix), result, "python", 0.5)
        assert (edits[0] is None) == (withheld is not None), edits
        assert (edits.withheld is None) if withheld is None else (withheld in str(edits.withheld)), edits.withheld
        assert infill_edits(protocol.Layout.FIM, _request(prefix, suffix), result, "python", 0.0).withheld is None


def _request(prefix: str, suffix: str) -> protocol.Infill:
    return protocol.Infill(id="a", uri="file:///a.py", prefix=prefix, suffix=suffix)
