"""A backend's answer to an infill as what each of its candidates puts at the cursor (the language server's
completions and the HTTP endpoint's choices), each cut to what the model is sure of (``minConfidence``)."""

from __future__ import annotations

from collections.abc import Iterable

from diffgemma_engine.shared import protocol
from diffgemma_lsp.postprocess.confidence import per_character, why_withheld
from diffgemma_lsp.postprocess.pipeline import Edit, gated, postprocess


class Candidates(list[Edit | None]):
    """What each candidate puts at the cursor, best first (None: nothing), and why the best one is withheld."""

    def __init__(self, edits: Iterable[Edit | None], withheld: str | None) -> None:
        super().__init__(edits)
        self.withheld = withheld
        """Why ``minConfidence`` withholds the best candidate, for a user who asked (None: it does not)."""


def infill_edits(
    layout: protocol.Layout,
    request: protocol.Infill,
    result: protocol.Result,
    language_id: str,
    min_confidence: float = 0.0,
    *,
    scored: bool = False,
) -> Candidates:
    """What each candidate of ``result`` (the answer to ``request`` from a backend of prompt ``layout``) puts at the
    cursor, best first: its post-processed edit cut to the part the model is sure of (``pipeline.gated``), or None
    where nothing is left or its start is unsure; and why the best is withheld (``confidence.why_withheld``). The
    confidences are carried where something reads them: the gate (``min_confidence`` above 0) or the editor
    (``scored``: ghost text, whose unsure part the Neovim plugin dims); else not (``confidence.carry`` costs about
    40% of post-processing: benchmarks/README.md, "Which confidence")."""
    edits = candidate_edits(layout, request, result, language_id, scored=scored or min_confidence > 0)
    shown = [None if edit is None else gated(edit, min_confidence) for edit in edits]
    best = edits[0]
    withheld = why_withheld(best.scored, min_confidence) if best is not None and shown[0] is None else None
    return Candidates(shown, withheld)


def candidate_edits(
    layout: protocol.Layout,
    request: protocol.Infill,
    result: protocol.Result,
    language_id: str,
    *,
    scored: bool = True,
) -> list[Edit | None]:
    """Each candidate post-processed, ungated, with (``scored``) the model's confidence in each character carried."""
    instruct = layout is protocol.Layout.CHAT  # an instruction model's answers are unwrapped first
    texts = [result.text, *result.alternatives]
    runs = result.alternative_confidence if len(result.alternative_confidence) == len(result.alternatives) else []
    confidences = [result.confidence, *(runs or [[] for _ in result.alternatives])] if scored else [[] for _ in texts]
    return [
        postprocess(
            request.prefix,
            request.suffix,
            raw,
            language_id,
            instruct=instruct,
            confidence=per_character(raw, confident),
        )
        for raw, confident in zip(texts, confidences, strict=True)
    ]
