"""The model's confidence in each character of its answer, kept aligned with the text through post-processing, and
the rule that uses it.

The engine sends runs of characters with a confidence each (``protocol.Result.confidence``: for each canvas position,
the share of its denoising steps its token has been the model's choice; through vLLM, its probability at the last step).
:class:`Scored` is a text with one confidence per character; every step that cuts or rewrites the text hands it on with
:meth:`Scored.then`, which carries the confidences to the new text by :func:`carry` (the one statement of that): a
character kept keeps its own, a character the step wrote in place of others (indentation fitted) takes the lowest of
those it replaced, one it added takes that of the character it was added before (a line break's ``\r``, a line's
indentation; at the end, the last one's), and a character dropped drops its own.

:func:`confident_part` is the rule: a suggestion is cut before its first unsure character (at the start of that
word), and withheld when nothing sure is left at its start; :func:`unsure_replacement` the same for a rewrite, which
is applied whole or not at all. Pure: stdlib and attrs only.
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from typing import Protocol

import attrs


class Run(Protocol):
    """A run of characters with one confidence (``protocol.Confident``)."""

    @property
    def chars(self) -> int: ...

    @property
    def p(self) -> float: ...


def per_character(text: str, runs: Sequence[Run]) -> tuple[float, ...] | None:
    """One confidence per character of ``text`` from the engine's runs; None when there are none, or when they do not
    cover ``text`` exactly (an answer whose confidence is not known is never gated on it)."""
    values = tuple(min(1.0, max(0.0, float(run.p))) for run in runs for _ in range(max(0, run.chars)))
    return values if values and len(values) == len(text) else None


def carry(before: str, after: str, confidence: Sequence[float]) -> tuple[float, ...]:
    """``confidence`` (one per character of ``before``) carried to ``after``, the text a step made of it."""
    if before == after:
        return tuple(confidence)
    out: list[float] = []
    matcher = difflib.SequenceMatcher(None, before, after, autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            out.extend(confidence[i1:i2])
        elif tag == "replace":
            out.extend([min(confidence[i1:i2])] * (j2 - j1))
        elif tag == "insert":
            beside = confidence[i1] if i1 < len(confidence) else confidence[i1 - 1] if i1 else 1.0
            out.extend([beside] * (j2 - j1))
    return tuple(out)


@attrs.frozen
class Scored:
    """A text and, when known, the model's confidence in each of its characters."""

    text: str
    confidence: tuple[float, ...] | None = None

    def then(self, text: str) -> Scored:
        """``text``, made by a step from this one, with the confidences carried to it."""
        if self.confidence is None or text == self.text:
            return Scored(text, self.confidence if text == self.text else None)
        return Scored(text, carry(self.text, text, self.confidence))

    def head(self, end: int) -> Scored:
        """The first ``end`` characters."""
        return Scored(self.text[:end], None if self.confidence is None else self.confidence[:end])

    def lowest(self) -> float | None:
        """The lowest confidence of a character that is not whitespace (None: not known, or only whitespace)."""
        if self.confidence is None:
            return None
        return min((p for char, p in zip(self.text, self.confidence, strict=True) if not char.isspace()), default=None)

    def mean(self) -> float | None:
        """The mean confidence of the characters that are not whitespace (None: not known, or only whitespace)."""
        if self.confidence is None:
            return None
        values = [p for char, p in zip(self.text, self.confidence, strict=True) if not char.isspace()]
        return sum(values) / len(values) if values else None


def _word(char: str) -> bool:
    return char.isalnum() or char == "_"


def first_unsure(scored: Scored, minimum: float) -> int | None:
    """Where the first character under ``minimum`` is, whitespace aside (None: none is, or it is not known)."""
    if scored.confidence is None:
        return None
    for index, (char, p) in enumerate(zip(scored.text, scored.confidence, strict=True)):
        if p < minimum and not char.isspace():
            return index
    return None


def confident_part(scored: Scored, minimum: float) -> Scored | None:
    """``scored`` cut before its first character under ``minimum`` (back to the start of that word, so that no word
    is shown in part), its trailing whitespace dropped; None when nothing but whitespace is left: the start is unsure,
    and the suggestion is withheld. A text whose confidence is not known, or a ``minimum`` of 0, passes whole."""
    at = first_unsure(scored, minimum) if minimum > 0 else None
    if at is None:
        return scored
    text = scored.text
    while at > 0 and _word(text[at]) and _word(text[at - 1]):
        at -= 1
    cut = scored.head(len(text[:at].rstrip()))
    return cut if cut.text.strip() else None


def unsure_replacement(scored: Scored, minimum: float) -> float | None:
    """The replacement's mean confidence (whitespace aside) when it is under ``minimum``: a rewrite that should not
    be applied; None when it may (sure enough, or its confidence not known)."""
    mean = scored.mean()
    return mean if mean is not None and minimum > 0 and mean < minimum else None


def why_withheld(scored: Scored, minimum: float) -> str | None:
    """What to tell a user who asked for a suggestion that :func:`confident_part` withholds; None when it does not."""
    at = first_unsure(scored, minimum) if minimum > 0 else None
    if at is None or confident_part(scored, minimum) is not None:
        return None
    assert scored.confidence is not None
    return (
        f"the model is unsure of how this suggestion starts (confidence {scored.confidence[at]:.2f}, under "
        f"minConfidence {minimum:g}): nothing shown"
    )


def why_refused(scored: Scored, minimum: float) -> str | None:
    """What to tell a user whose rewrite :func:`unsure_replacement` refuses; None when it may be applied."""
    mean = unsure_replacement(scored, minimum)
    if mean is None:
        return None
    return (
        f"the rewrite was not applied: the model is unsure of it (confidence {mean:.2f} on average, under "
        f"minConfidence {minimum:g}); the code is left as it was"
    )
