"""Several requests in one decoder pass: each row its own prompt, cache and stop check.

Requests queued together with the same canvas length and step budget are denoised as one batch. Their
prompts have different lengths, so each row's cached keys are left-padded to the longest and hidden by the
decoder's attention mask, and each row's canvas keeps its own positions (the cached keys carry theirs from
encoding). A row that is cancelled or runs out of time is frozen while the others go on.
"""

from __future__ import annotations

import dataclasses
import time

import torch
import torch.nn.functional as F
from transformers import DynamicCache

from engine import protocol
from engine.denoise import denoise_canvas
from engine.errors import BadRequestError
from engine.infill import check_request, finish_row, timed_prompt_ids
from engine.jobs import Job
from engine.model import LoadedModel
from engine.quantize import grad_mode

MAX_BATCH = 4


def compatible(first: Job, other: Job, loaded: LoadedModel) -> bool:
    """Whether ``other`` can share a decoder pass with ``first`` (seeded requests run alone, reproducibly)."""
    a, b = first.request, other.request
    if a.seed is not None or b.seed is not None or other.cancel_reason is not None:
        return False
    if a.candidates > 1 or b.candidates > 1:
        return False  # already a batch of its own
    try:
        return check_request(loaded, a) == check_request(loaded, b)  # the same canvas length and step count
    except BadRequestError:
        return False  # it fails on its own


def stack_views(views: list[DynamicCache], text_config: object) -> tuple[DynamicCache, torch.Tensor]:
    """One batched cache from per-row decoder views, left-padded; returns it with its (B, L) padding mask."""
    lengths = [view.get_seq_length() for view in views]
    longest = max(lengths)
    batched = DynamicCache(config=text_config)
    for index, layer in enumerate(batched.layers):
        width = min(longest, layer.sliding_window - 1) if layer.is_sliding else longest
        keys = torch.cat([F.pad(v.layers[index].keys, (0, 0, width - v.layers[index].keys.shape[2], 0)) for v in views])
        values = torch.cat(
            [F.pad(v.layers[index].values, (0, 0, width - v.layers[index].values.shape[2], 0)) for v in views]
        )
        layer.lazy_initialization(keys, values)
        layer.keys, layer.values = keys, values
        if layer.is_sliding:
            layer.cumulative_length = longest
    mask = torch.zeros((len(views), longest), dtype=torch.bool, device=views[0].layers[0].keys.device)
    for row, length in enumerate(lengths):
        mask[row, longest - length :] = True
    return batched, mask


def stack_rows(
    views: list[DynamicCache], text_config: object, canvas_length: int
) -> tuple[DynamicCache, torch.Tensor, torch.Tensor]:
    """The decoder's batched inputs: the left-padded cache (``stack_views``), each row's canvas positions (B, C)
    after its own prompt, and the decoder mask (B, L + C) that hides the padding."""
    cache, padding = stack_views(views, text_config)
    device = padding.device
    starts = [view.get_seq_length() for view in views]
    positions = torch.stack(
        [torch.arange(start, start + canvas_length, dtype=torch.int32, device=device) for start in starts]
    )
    canvas = torch.ones((len(views), canvas_length), dtype=torch.bool, device=device)
    return cache, positions, torch.cat([padding, canvas], dim=1)


def run_batch(loaded: LoadedModel, jobs: list[Job]) -> list[tuple[str, protocol.StopReason, protocol.Timings]]:
    """Denoise one canvas for each job in a single batch; returns each job's (text, stop reason, timings)."""
    assert loaded.prefix_cache is not None
    canvas_length, steps = check_request(loaded, jobs[0].request)
    views, reused, prompt_lengths, tokenize_ms, encode_ms = [], [], [], [], []
    for job in jobs:
        ids, tokenized_ms = timed_prompt_ids(loaded, job.request)
        start = time.perf_counter()
        view, cached = loaded.prefix_cache.prepare(job.key, ids)
        tokenize_ms.append(tokenized_ms)
        encode_ms.append((time.perf_counter() - start) * 1000)
        views.append(view)
        reused.append(cached)
        prompt_lengths.append(len(ids))
    with grad_mode(loaded.model)():  # the views' mode (inference tensors, unless torchao's need no_grad)
        cache, positions, decoder_mask = stack_rows(views, loaded.prefix_cache.text_config, canvas_length)
    settings = dataclasses.replace(loaded.sampler, max_steps=steps)
    start = time.perf_counter()
    denoised = denoise_canvas(
        loaded.model,
        cache,
        len(jobs),
        canvas_length,
        settings,
        position_ids=positions,
        decoder_mask=decoder_mask,
        row_checks=[job.should_stop for job in jobs],
        step=loaded.step,
    )
    denoise_ms = (time.perf_counter() - start) * 1000
    return [
        finish_row(
            loaded,
            denoised.tokens[row].tolist(),
            denoised.row_stops[row],
            tokenize_ms=tokenize_ms[row],
            encode_ms=encode_ms[row],
            denoise_ms=denoise_ms,
            steps=denoised.row_steps[row],
            prompt_tokens=prompt_lengths[row],
            cached_tokens=reused[row],
        )
        for row in range(len(jobs))
    ]
