"""Serve one ``Infill`` request: prompt layout, one canvas, and the text between the cursor and the suffix.

The canvas (``engine.canvas``) hands back token ids; this module cuts them at the first end-of-sequence token
and decodes them (``finish_row``, also used for each row of a batch by ``engine.batch``).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import time
from collections.abc import Hashable
from typing import Any

import attrs
import torch

from . import protocol
from .canvas.denoise import StopCheck, run_canvas
from .errors import BadRequestError
from .model import LoadedModel
from .prompt import Prompt, char_budget_cut, parts_of

MAX_CANVAS_LENGTH = protocol.MAX_CANVAS_LENGTH
MAX_STEPS = protocol.MAX_STEPS
CHARS_PER_TOKEN = 4


def build_prompt(loaded: LoadedModel, request: protocol.Infill) -> Prompt:
    """The encoder input for ``request`` in the checkpoint's layout, within ``max_prompt_tokens``."""
    # Never tokenize more text than could fit: a few characters per token at most. Other files may take a
    # quarter of the budget, whole chunks in order: the first that could not fit ends them, before tokenizing.
    max_chars = loaded.max_prompt_tokens * CHARS_PER_TOKEN * 2
    parts = parts_of(request)
    extra = list(itertools.takewhile(lambda chunk: len(chunk[1]) <= max_chars // 4, parts.extra))
    parts = char_budget_cut(attrs.evolve(parts, extra=extra), max_chars)
    return loaded.layout.prompt(parts, loaded.max_prompt_tokens)


def prompt_ids(loaded: LoadedModel, request: protocol.Infill) -> list[int]:
    """The ids of ``build_prompt``."""
    return build_prompt(loaded, request).ids


def timed_prompt_ids(loaded: LoadedModel, request: protocol.Infill) -> tuple[list[int], float]:
    """``prompt_ids`` and the milliseconds it took (``Timings.tokenize_ms``)."""
    started = time.perf_counter()
    ids = prompt_ids(loaded, request)
    return ids, (time.perf_counter() - started) * 1000


SCOPES = ("", "line", "block")
MAX_CANDIDATES = 4


def check_request(loaded: LoadedModel, request: protocol.Infill) -> tuple[int, int]:
    """The (canvas length, max steps) to use, or ``BadRequestError`` naming the bad value.

    Unless the request says, the canvas is the model's own, or its ``line_canvas_length`` for the rest of a line;
    the model's step count shrinks with a shorter canvas, so that each step still fixes as many tokens.
    """
    if not 1 <= request.candidates <= MAX_CANDIDATES:
        raise BadRequestError(f"candidates must be between 1 and {MAX_CANDIDATES}, got {request.candidates}")
    if request.scope not in SCOPES:
        raise BadRequestError(f"scope must be one of {', '.join(map(repr, SCOPES))}, got {request.scope!r}")
    canvas = request.canvas_length
    if not canvas:
        short = loaded.line_canvas_length if request.scope == "line" else None
        canvas = min(short, loaded.canvas_length) if short else loaded.canvas_length
    steps = request.max_steps
    if not steps:
        steps = loaded.sampler.max_steps
        if canvas < loaded.canvas_length:
            steps = max(1, math.ceil(steps * canvas / loaded.canvas_length))
    if not 1 <= canvas <= MAX_CANVAS_LENGTH:
        raise BadRequestError(f"canvas_length must be between 1 and {MAX_CANVAS_LENGTH}, got {canvas}")
    if not 1 <= steps <= MAX_STEPS:
        raise BadRequestError(f"max_steps must be between 1 and {MAX_STEPS}, got {steps}")
    if request.deadline_ms < 0:
        raise BadRequestError(f"deadline_ms must be 0 (none) or positive, got {request.deadline_ms}")
    return canvas, steps


def run_infill(
    loaded: LoadedModel,
    request: protocol.Infill,
    should_stop: StopCheck | None = None,
    cache_key: Hashable | None = None,
    time_left_ms: float | None = None,
) -> tuple[str, protocol.StopReason, protocol.Timings]:
    """Denoise the middle for ``request``; returns (text, why it stopped, timings without queue time).

    ``cache_key`` (e.g. the connection and document) lets the prompt's encoding be reused by the next request
    with the same key. ``time_left_ms`` (what remains of the deadline) becomes a step budget, so that a whole
    temperature schedule fits in it instead of being cut off part-way.
    """
    canvas_length, steps = check_request(loaded, request)
    if time_left_ms is not None:
        steps = loaded.clock.step_budget(canvas_length, steps, time_left_ms)
    ids, tokenize_ms = timed_prompt_ids(loaded, request)
    generator = None
    if request.seed is not None:
        generator = torch.Generator(device=loaded.device).manual_seed(request.seed)
    settings = dataclasses.replace(loaded.sampler, max_steps=steps)
    prompt = torch.tensor([ids], dtype=torch.long, device=loaded.device)
    out = run_canvas(
        loaded.model,
        prompt,
        canvas_length,
        settings,
        generator,
        should_stop,
        prefix_cache=loaded.prefix_cache,
        cache_key=cache_key,
        step=loaded.step,
    )
    loaded.clock.observe(canvas_length, out.encode_ms, out.denoise_ms, out.steps)
    return finish_row(
        loaded,
        out.tokens[0].tolist(),
        out.stopped_by,
        tokenize_ms=tokenize_ms,
        encode_ms=out.encode_ms,
        denoise_ms=out.denoise_ms,
        steps=out.steps,
        prompt_tokens=len(ids),
        cached_tokens=out.cached_tokens,
    )


def finish_row(
    loaded: LoadedModel, canvas: list[int], stopped_by: str | None, **timings: float
) -> tuple[str, protocol.StopReason, protocol.Timings]:
    """(text, stop reason, timings) of one denoised canvas row; ``stopped_by`` is a cancel/deadline reason."""
    tokens, found_eos = cut_at_eos(canvas, loaded.eos_ids, loaded.pad_id)
    if stopped_by is not None:
        stop = protocol.StopReason(stopped_by)
    else:
        stop = protocol.StopReason.EOS if found_eos else protocol.StopReason.LENGTH
    dropped = stop in (protocol.StopReason.CANCELLED, protocol.StopReason.SUPERSEDED)
    rounded: dict[str, Any] = {
        name: round(value, 3) if name.endswith("_ms") else int(value) for name, value in timings.items()
    }
    return "" if dropped else loaded.decode(tokens), stop, protocol.Timings(new_tokens=len(tokens), **rounded)


def cut_at_eos(tokens: list[int], eos_ids: set[int], pad_id: int | None) -> tuple[list[int], bool]:
    """The tokens before the first end-of-sequence, and whether one was found; pads are dropped."""
    out: list[int] = []
    for token in tokens:
        if token in eos_ids:
            return out, True
        if token != pad_id:
            out.append(token)
    return out, False
