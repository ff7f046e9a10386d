"""Refine as you type (issue 45, part 1): the user typed into a shown suggestion and the text diverged from it.

A left-to-right model can only throw the suggestion away and start again after the new text. A diffusion canvas can
keep it: the canvas starts from the shown text (a rewrite's seeded canvas, ``protocol.Infill.start``) at the cursor
where the suggestion was offered, the typed characters held (a ``keep`` segment: pinned at every step, on the
engine's own loop and as ``diffusion_pinned`` on vLLM), the rest of the shown text, overwritten by what was typed,
renoised in part and denoised again for a few steps (``refineSteps``). Its answer starts with the typed text; what
follows it is the refined suggestion.

Pure: no LSP, no engine; ``features/completion.py`` asks it and sends what it lays out.
"""

from __future__ import annotations

import math

import attrs

from diffgemma_engine.shared import protocol
from diffgemma_lsp.postprocess import postprocess
from diffgemma_lsp.reuse import Shown

REFINE_STRENGTH = 0.5
"""The share of the shown text's positions renoised at the start of a refine, and of its schedule that runs: the
schedule sent is ``refineSteps / REFINE_STRENGTH`` long, so that ``refineSteps`` of it run, from its middle (half
the tokens kept as shown, a temperature half-way down)."""


@attrs.frozen(kw_only=True)
class Divergence:
    """The user typed into a shown suggestion something it does not start with."""

    offset: int
    """Where the suggestion was offered (code points): the refine's canvas starts there."""
    typed: str
    """What was typed since, from ``offset`` to the cursor: held fixed in the canvas."""
    seed: str
    """The shown text after the typed characters' length (the typed ones written over it): the canvas's start for
    the rest, to be denoised again."""


def diverged(shown: Shown, source: str, cursor: int) -> Divergence | None:
    """The divergence from ``shown`` of the document ``source`` with the cursor at ``cursor``: the user typed where
    it was offered something it does not start with, changed nothing around it (``Shown.typed``), and some of it is
    left to refine. None otherwise (nothing typed, typed what was shown, or edited elsewhere)."""
    typed = shown.typed(source, cursor)
    if typed is None or shown.text.startswith(typed) or len(typed) >= len(shown.text):
        return None  # what was shown is still right (``reuse.py``), or all of it was typed over
    return Divergence(offset=shown.offset, typed=typed, seed=shown.text[len(typed) :])


def refine_request(insertion: protocol.Infill, divergence: Divergence, steps: int) -> protocol.Infill:
    """The infill that refines the shown suggestion, from ``insertion`` (the completion at the cursor, its prefix
    ending with the typed text): its prefix cut to where the suggestion was offered, its canvas starting from the
    typed text (held) and the seed, ``steps`` of its schedule run (``REFINE_STRENGTH``)."""
    if not insertion.prefix.endswith(divergence.typed):
        raise ValueError("the insertion's prefix must end with the typed text")
    prefix = insertion.prefix[: len(insertion.prefix) - len(divergence.typed)]
    return attrs.evolve(
        insertion,
        prefix=prefix,
        scope=protocol.cursor_scope(prefix),
        start=[
            protocol.StartSegment(text=divergence.typed, keep=True),
            protocol.StartSegment(text=divergence.seed),
        ],
        refine=True,
        strength=REFINE_STRENGTH,
        max_steps=min(protocol.MAX_STEPS, math.ceil(steps / REFINE_STRENGTH)),
        candidates=1,
    )


def refined(divergence: Divergence, answer: str) -> str | None:
    """What the refine's (post-processed) ``answer`` suggests after the cursor: the rest after the typed text, or
    None when it does not start with it or nothing follows."""
    if not answer.startswith(divergence.typed) or len(answer) == len(divergence.typed):
        return None
    return answer[len(divergence.typed) :]


def refined_answer(divergence: Divergence, request: protocol.Infill, raw: str, instruct: bool = False) -> str | None:
    """What the engine's ``raw`` answer to the refine ``request`` suggests after the cursor: post-processed as a
    completion where the suggestion was offered (``postprocess``), then ``refined``."""
    edit = postprocess(request.prefix, request.suffix, raw, request.language_id, instruct=instruct)
    return None if edit is None else refined(divergence, edit.text)
