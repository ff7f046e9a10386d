"""Token confidences as runs of characters (``protocol.Confident``): what the wire carries with an answer.

The canvas gives one confidence per position (``diffgemma_engine.canvas.loop.Denoised.confidence``, or vLLM's logprob of
each token it emits, at the last step); the language server cuts and rewrites characters. Each token's characters are
found by decoding: one token at a time where the pieces join up to the whole text (most tokenizers), else by decoding
each prefix and keeping the part it shares with the whole. A character that several tokens make together (a byte-level
piece of one character) takes the lowest of their confidences.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence

from ..shared import protocol

Decode = Callable[[list[int]], str]


def token_boundaries(decode: Decode, tokens: Sequence[int], text: str) -> list[int]:
    """Where each token's characters end in ``text`` (``decode(tokens)``), non-decreasing, the last ``len(text)``."""
    pieces = [decode([token]) for token in tokens]
    if "".join(pieces) == text:
        ends, at = [], 0
        for piece in pieces:
            at += len(piece)
            ends.append(at)
        return ends
    ends, at = [], 0
    for count in range(1, len(tokens) + 1):
        shared = len(os.path.commonprefix([decode(list(tokens[:count])), text]))
        at = max(at, shared)
        ends.append(at)
    if ends:
        ends[-1] = len(text)
    return ends


def confidence_runs(
    decode: Decode, tokens: Sequence[int], confidence: Sequence[float], text: str
) -> list[protocol.Confident]:
    """``text``'s characters in runs with their confidence: one run per token that ends a character (a token with
    none of its own lends its confidence, if lower, to the next that has)."""
    if len(tokens) != len(confidence):
        raise ValueError(f"{len(tokens)} tokens and {len(confidence)} confidences")
    runs: list[protocol.Confident] = []
    start, pending = 0, 1.0
    for end, value in zip(token_boundaries(decode, tokens, text), confidence, strict=True):
        pending = min(pending, float(value))
        if end > start:
            runs.append(protocol.Confident(chars=end - start, p=round(pending, 4)))
            start, pending = end, 1.0
    return runs
