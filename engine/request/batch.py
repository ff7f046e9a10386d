"""Several requests in one decoder pass: each row its own prompt, cache and stop check.

Requests queued together with the same canvas length and step budget are denoised as one batch. Their
prompts have different lengths, so each row's cached keys are left-padded to the longest and hidden by the
decoder's attention mask, and each row's canvas keeps its own positions (the cached keys carry theirs from
encoding). A row that is cancelled or runs out of time is frozen while the others go on.

It takes rows (a request, whose encoded prompt to reuse, when to stop), not the queue's jobs:
``diffgemma_engine.runtimes.own_loop`` turns the jobs it is given into rows. A rewrite (``Infill.start``) runs
alone, or with its own candidates: its rows share one start and one shortened schedule, which other requests' rows
do not.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Hashable, Sequence

import attrs

from ..canvas.caches import stack_rows
from ..canvas.clock import hold_deadline
from ..canvas.denoise import denoise_canvas
from ..canvas.loop import StopCheck
from ..canvas.runtime import grad_mode
from ..errors import BadRequestError
from ..loading.model import LoadedModel
from ..shared import protocol
from .infill import Answer, check_request, finish_row, start_canvas, timed_prompt_ids, timed_start_row


@attrs.frozen(kw_only=True)
class Row:
    """One request of a batch."""

    request: protocol.Infill
    cache_key: Hashable
    """Whose encoded prompt to reuse and keep (the connection and document)."""
    should_stop: StopCheck
    """Asked before each step: a reason to stop this row (cancelled, deadline), or None."""


def compatible(a: protocol.Infill, b: protocol.Infill, loaded: LoadedModel) -> bool:
    """Whether ``b`` can share a decoder pass with ``a`` (seeded requests run alone, reproducibly)."""
    if a.seed is not None or b.seed is not None:
        return False
    if a.candidates > 1 or b.candidates > 1:
        return False  # already a batch of its own
    if a.start or b.start:
        return False  # a rewrite starts part-way down its schedule, from its own canvas
    try:
        return check_request(loaded, a) == check_request(loaded, b)  # the same canvas length and step count
    except BadRequestError:
        return False  # it fails on its own


def run_batch(loaded: LoadedModel, rows: Sequence[Row]) -> list[Answer]:
    """Denoise one canvas for each row in a single batch; returns each row's answer."""
    assert loaded.serving.prefix_cache is not None
    canvas_length, steps = check_request(loaded, rows[0].request)
    views, reused, prompt_lengths, tokenize_ms, encode_ms, starts = [], [], [], [], [], []
    for row in rows:
        first_canvas, start_ms = timed_start_row(loaded, row.request, canvas_length)
        ids, tokenized_ms = timed_prompt_ids(loaded, row.request)
        start = time.perf_counter()
        view, cached = loaded.serving.prefix_cache.prepare(row.cache_key, ids)
        starts.append(first_canvas)
        tokenize_ms.append(start_ms + tokenized_ms)
        encode_ms.append((time.perf_counter() - start) * 1000)
        views.append(view)
        reused.append(cached)
        prompt_lengths.append(len(ids))
    with grad_mode(loaded.model)():  # the views' mode (inference tensors, unless torchao's need no_grad)
        cache, positions, decoder_mask = stack_rows(views, loaded.serving.prefix_cache.text_config, canvas_length)
    settings = dataclasses.replace(loaded.sampler, max_steps=steps)
    start = time.perf_counter()
    denoised = denoise_canvas(
        loaded.model,
        cache,
        len(rows),
        canvas_length,
        settings,
        position_ids=positions,
        decoder_mask=decoder_mask,
        row_checks=[hold_deadline(row.should_stop, loaded.step_floor(steps)) for row in rows],
        step=loaded.serving.step,
        start=start_canvas(loaded, [row.request for row in rows], starts),
    )
    denoise_ms = (time.perf_counter() - start) * 1000
    held_until = [first_canvas.held_until if first_canvas is not None else 0 for first_canvas in starts]
    return [
        finish_row(
            loaded,
            denoised.tokens[index].tolist(),
            denoised.row_stops[index],
            held_until=held_until[index],
            confidence=None if denoised.confidence is None else denoised.confidence[index].tolist(),
            tokenize_ms=tokenize_ms[index],
            encode_ms=encode_ms[index],
            denoise_ms=denoise_ms,
            steps=denoised.row_steps[index],
            prompt_tokens=prompt_lengths[index],
            cached_tokens=reused[index],
        )
        for index in range(len(rows))
    ]
