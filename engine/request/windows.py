"""A rewrite with more places of its document (``Infill.windows``, a next edit's chain): every window in one batch.

Each window is the request itself with its own prefix, suffix and start (``each_window``). The windows share one
strength, canvas length and step count (the request's), so their rows (``candidates`` each) share the decoder
passes of ``diffgemma_engine.request.batch``, as many rows at a time as the memory holds (``loaded.max_rows``).
The prompts share the document's text up to the first window, and under the request's one cache key the prefix
cache encodes only what differs. On vLLM each window is one completions request, all sent at once
(``diffgemma_engine.request.on_vllm.run_windows_on_vllm``): vLLM batches what is in flight.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import attrs

from ..errors import BadRequestError
from ..loading.model import LoadedModel
from ..shared import protocol
from .batch import Row, run_batch
from .infill import Answer


def each_window(request: protocol.Infill) -> list[protocol.Infill]:
    """The request's own window, then each of its ``windows``, as requests of their own (without windows).
    ``BadRequestError`` for more than ``MAX_WINDOWS``, or windows without a rewrite's start."""
    if len(request.windows) > protocol.MAX_WINDOWS:
        raise BadRequestError(f"windows: at most {protocol.MAX_WINDOWS} in one request, got {len(request.windows)}")
    if request.windows and not request.start:
        raise BadRequestError("windows are more places of a rewrite: the request needs its own start")
    own = attrs.evolve(request, windows=[])
    return [own, *(attrs.evolve(own, prefix=w.prefix, suffix=w.suffix, start=w.start) for w in request.windows)]


def per_window(answers: Sequence[Answer], windows: int) -> list[list[Answer]]:
    """A flat list of answers, ``windows`` groups of equal size in order, split back into the groups."""
    size = len(answers) // windows
    return [list(answers[index * size : (index + 1) * size]) for index in range(windows)]


def run_windows(
    loaded: LoadedModel, request: protocol.Infill, row: Callable[[protocol.Infill], Row]
) -> list[list[Answer]]:
    """Each window's answers (one per candidate), in ``each_window``'s order, denoised in batches of at most
    ``loaded.max_rows`` rows (one batch when they fit); ``row`` makes a window's request a batch row (its cache key
    and stop check)."""
    requests = each_window(request)
    rows = [row(window) for window in requests for _ in range(window.candidates)]
    size = max(1, loaded.max_rows)
    answers: list[Answer] = []
    for first in range(0, len(rows), size):
        answers += run_batch(loaded, rows[first : first + size])
    return per_window(answers, len(requests))
