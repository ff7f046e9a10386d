"""A backend's answer to an infill as what each of its candidates puts at the cursor (the language server's
completions and the HTTP endpoint's choices)."""

from __future__ import annotations

from diffgemma_engine.shared import protocol
from diffgemma_lsp.postprocess.pipeline import Edit, postprocess


def infill_edits(
    layout: protocol.Layout, request: protocol.Infill, result: protocol.Result, language_id: str
) -> list[Edit | None]:
    """What each candidate of ``result`` (the answer to ``request`` from a backend of prompt ``layout``) puts at the
    cursor, best first: its post-processed edit, or None where nothing is left."""
    instruct = layout is protocol.Layout.CHAT  # an instruction model's answers are unwrapped first
    return [
        postprocess(request.prefix, request.suffix, raw, language_id, instruct=instruct)
        for raw in (result.text, *result.alternatives)
    ]
