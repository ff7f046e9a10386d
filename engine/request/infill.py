"""Serve one ``Infill`` request: prompt layout, one canvas, and the text between the cursor and the suffix.

The canvas (``diffgemma_engine.canvas``) hands back token ids; this module cuts them at the first end-of-sequence token
and decodes them (``finish_row``, also used for each row of a batch by ``diffgemma_engine.request.batch``).

A rewrite (``Infill.start``) is the same request with a canvas that starts from the selection instead of noise
(``start_row``): its segments' tokens, then end-of-sequence and padding, as training lays out a middle; ``keep``
segments are held fixed. Its prompt is the insertion's (a chat layout adds the selection and the instruction), and
the loop runs the part of its schedule that ``strength`` calls for (``diffgemma_engine.canvas.start.start_step``).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import time
from collections.abc import Hashable, Iterator, Sequence
from typing import Any, NamedTuple

import attrs
import torch

from ..canvas.clock import StepClock, hold_deadline
from ..canvas.denoise import run_canvas
from ..canvas.loop import StopCheck
from ..canvas.start import StartCanvas, start_step
from ..errors import BadRequestError
from ..loading.model import LoadedModel
from ..shared import protocol
from ..shared.prompt import Prompt, char_budget_cut, parts_of, text_encoder
from .confidence import confidence_runs

MAX_CANVAS_LENGTH = protocol.MAX_CANVAS_LENGTH
MAX_STEPS = protocol.MAX_STEPS
MAX_INSTRUCTION_CHARS = protocol.MAX_INSTRUCTION_CHARS
CHARS_PER_TOKEN = 4


@attrs.frozen
class Answer:
    """What one canvas row answers (``text, stop, timings = run_infill(...)`` and ``answer[0]`` read its first three,
    as when it was a named tuple of them)."""

    text: str
    """The completion or replacement; "" when the request was cancelled or superseded."""
    stop: protocol.StopReason
    timings: protocol.Timings
    confidence: list[protocol.Confident] = attrs.field(factory=list)
    """``text``'s characters in runs with the model's confidence in them (empty: not known)."""

    def __iter__(self) -> Iterator[Any]:
        return iter((self.text, self.stop, self.timings))

    def __getitem__(self, index: int) -> Any:
        return (self.text, self.stop, self.timings)[index]


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


MAX_CANDIDATES = 4


def check_request(loaded: LoadedModel, request: protocol.Infill) -> tuple[int, int]:
    """The (canvas length, max steps) to use, or ``BadRequestError`` naming the bad value.

    Unless the request says, the canvas is the model's own, or its ``line_canvas_length`` for the rest of a line;
    the model's step count shrinks with a shorter canvas, so that each step still fixes as many tokens.
    """
    if not 1 <= request.candidates <= MAX_CANDIDATES:
        raise BadRequestError(f"candidates must be between 1 and {MAX_CANDIDATES}, got {request.candidates}")
    canvas = request.canvas_length
    if not canvas:
        short = loaded.line_canvas_length if request.scope is protocol.Scope.LINE else None
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
    if not 0.0 < request.strength <= 1.0:  # NaN too
        raise BadRequestError(f"strength must be more than 0 and at most 1, got {request.strength}")
    if len(request.instruction) > MAX_INSTRUCTION_CHARS:
        raise BadRequestError(
            f"the instruction is {len(request.instruction)} characters, more than {MAX_INSTRUCTION_CHARS}: shorten it"
        )
    return canvas, steps


@attrs.frozen
class StartRow:
    """A rewrite's first canvas, as token ids, and what of it is held."""

    tokens: list[int]
    """The segments' tokens, end-of-sequence, then padding: the canvas length."""
    held: list[bool]
    """Per position: a ``keep`` segment's token, fixed through denoising."""

    @property
    def held_until(self) -> int:
        """The position after the last held token (0: none held)."""
        return max((index + 1 for index, held in enumerate(self.held) if held), default=0)


def end_ids(loaded: LoadedModel) -> tuple[int, int]:
    """(end-of-sequence, padding) for a start canvas: the tokenizer's end-of-sequence when the model stops on it
    (else the lowest id it stops on), and its padding (else end-of-sequence again)."""
    eos = loaded.tokenizer.eos_token_id
    if eos not in loaded.eos_ids:
        if not loaded.eos_ids:
            raise BadRequestError("the model has no end-of-sequence token, so a rewrite's length cannot be marked")
        eos = min(loaded.eos_ids)
    assert isinstance(eos, int)
    return eos, loaded.pad_id if loaded.pad_id is not None else eos


def start_row(loaded: LoadedModel, request: protocol.Infill, canvas_length: int) -> StartRow | None:
    """The canvas a rewrite starts from, laid out as training lays out a middle (``diffgemma_engine.training.data``):
    each segment's tokens in order (its text encoded as text: special tokens written in it stay ordinary tokens), then
    end-of-sequence and padding to ``canvas_length``. None for an insertion. ``BadRequestError`` when the selection
    and its end-of-sequence token do not fit one canvas."""
    if not request.start:
        return None
    chars = sum(len(segment.text) for segment in request.start)
    if chars > protocol.max_start_chars(canvas_length):  # cannot fit: refused before it is tokenized
        raise BadRequestError(
            f"the selection is {chars} characters, more than one canvas of {canvas_length} tokens holds: select less"
        )
    encode = text_encoder(loaded.tokenizer)
    tokens: list[int] = []
    held: list[bool] = []
    for segment in request.start:
        ids = encode(segment.text) if segment.text else []
        tokens += ids
        held += [segment.keep] * len(ids)
    if len(tokens) >= canvas_length:
        raise BadRequestError(
            f"the selection is {len(tokens)} tokens, more than one canvas of {canvas_length} holds "
            f"({canvas_length - 1} and its end-of-sequence token): select less"
        )
    eos, pad = end_ids(loaded)
    padding = canvas_length - len(tokens) - 1
    return StartRow(tokens=[*tokens, eos, *[pad] * padding], held=[*held, *[False] * (padding + 1)])


def start_canvas(
    loaded: LoadedModel, requests: Sequence[protocol.Infill], rows: Sequence[StartRow | None]
) -> StartCanvas | None:
    """The ``StartCanvas`` of a batch's rows (None: insertions, from noise). Its rows share one schedule, so they
    are all rewrites of one strength (``diffgemma_engine.request.batch.compatible`` keeps others apart)."""
    if all(row is None for row in rows):
        return None
    strengths = {request.strength for request in requests}
    if any(row is None for row in rows) or len(strengths) > 1:
        raise ValueError("a batch's rows must all be rewrites of one strength, or all insertions")
    starts = [row for row in rows if row is not None]
    held = torch.tensor([row.held for row in starts], dtype=torch.bool, device=loaded.device)
    return StartCanvas(
        tokens=torch.tensor([row.tokens for row in starts], dtype=torch.long, device=loaded.device),
        fixed=held if bool(held.any()) else None,
        strength=strengths.pop(),
    )


def timed_start_row(loaded: LoadedModel, request: protocol.Infill, canvas_length: int) -> tuple[StartRow | None, float]:
    """``start_row`` and the milliseconds it took (counted in ``Timings.tokenize_ms``)."""
    started = time.perf_counter()
    row = start_row(loaded, request, canvas_length)
    return row, (time.perf_counter() - started) * 1000


def strength_of(request: protocol.Infill) -> float:
    """The share of the schedule a request runs: its ``strength`` for a rewrite, the whole for an insertion."""
    return request.strength if request.start else 1.0


def budget_steps(
    clock: StepClock, canvas_length: int, steps: int, strength: float, time_left_ms: float, floor: int = 1
) -> int:
    """The schedule's length (``max_steps``) whose run from ``start_step(strength, ...)`` down to 1 is expected to
    fit in ``time_left_ms``: ``steps`` when it fits, else a shorter schedule, whole, but never shorter than
    ``floor`` (``LoadedModel.step_floor``): a deadline that cannot afford the floor makes the answer later."""
    run = start_step(strength, steps)
    affordable = clock.step_budget(canvas_length, run, time_left_ms)
    schedule = steps if affordable >= run else max(1, int(affordable / strength))
    return max(schedule, min(floor, steps))


def floored(should_stop: StopCheck | None, floor: int, strength: float) -> StopCheck | None:
    """``should_stop`` with its deadline held until the run of a ``floor``-step schedule from ``strength`` has been
    done (``diffgemma_engine.canvas.clock.hold_deadline``); a cancel or a newer request still stops it at once."""
    if should_stop is None:
        return None
    return hold_deadline(should_stop, start_step(strength, floor))


class LaidOut(NamedTuple):
    """A request checked and laid out, before any canvas runs (``lay_out``)."""

    canvas_length: int
    steps: int
    """The schedule's length, after a deadline's step budget."""
    floor: int
    """The fewest steps a deadline leaves it (``LoadedModel.step_floor``)."""
    row: StartRow | None
    """A rewrite's start; None for an insertion."""
    prompt_ids: list[int]
    tokenize_ms: float


def lay_out(loaded: LoadedModel, request: protocol.Infill, time_left_ms: float | None = None) -> LaidOut:
    """``request`` checked (``BadRequestError``), its canvas and schedule (``time_left_ms``, what remains of the
    deadline, becomes a step budget), its start and its prompt ids: what every runtime runs."""
    canvas_length, steps = check_request(loaded, request)
    floor = loaded.step_floor(steps)
    if time_left_ms is not None:
        steps = budget_steps(loaded.clock, canvas_length, steps, strength_of(request), time_left_ms, floor)
    row, start_ms = timed_start_row(loaded, request, canvas_length)
    ids, tokenize_ms = timed_prompt_ids(loaded, request)
    return LaidOut(canvas_length, steps, floor, row, ids, start_ms + tokenize_ms)


def seeded(loaded: LoadedModel, request: protocol.Infill) -> torch.Generator | None:
    """The request's random stream on the model's device (None: unseeded)."""
    if request.seed is None:
        return None
    return torch.Generator(device=loaded.device).manual_seed(request.seed)


def run_infill(
    loaded: LoadedModel,
    request: protocol.Infill,
    should_stop: StopCheck | None = None,
    cache_key: Hashable | None = None,
    time_left_ms: float | None = None,
) -> Answer:
    """Denoise the middle for ``request``; returns (text, why it stopped, timings without queue time).

    ``cache_key`` (e.g. the connection and document) lets the prompt's encoding be reused by the next request
    with the same key. ``time_left_ms`` (what remains of the deadline) becomes a step budget, so that a whole
    temperature schedule fits in it instead of being cut off part-way.
    """
    canvas_length, steps, floor, row, ids, tokenize_ms = lay_out(loaded, request, time_left_ms)
    should_stop = floored(should_stop, floor, strength_of(request))
    generator = seeded(loaded, request)
    settings = dataclasses.replace(loaded.sampler, max_steps=steps)
    prompt = torch.tensor([ids], dtype=torch.long, device=loaded.device)
    out = run_canvas(
        loaded.model,
        prompt,
        canvas_length,
        settings,
        generator,
        should_stop,
        prefix_cache=loaded.serving.prefix_cache,
        cache_key=cache_key,
        step=loaded.serving.step,
        start=start_canvas(loaded, [request], [row]),
        loop=loaded.serving.loop,
    )
    loaded.serving.clock.observe(canvas_length, out.encode_ms, out.denoise_ms, out.steps)
    return finish_row(
        loaded,
        out.tokens[0].tolist(),
        out.stopped_by,
        held_until=row.held_until if row is not None else 0,
        confidence=None if out.confidence is None else out.confidence[0].tolist(),
        tokenize_ms=tokenize_ms,
        encode_ms=out.encode_ms,
        denoise_ms=out.denoise_ms,
        steps=out.steps,
        prompt_tokens=len(ids),
        cached_tokens=out.cached_tokens,
    )


def finish_row(
    loaded: LoadedModel,
    canvas: list[int],
    stopped_by: str | None,
    held_until: int = 0,
    confidence: Sequence[float] | None = None,
    **timings: float,
) -> Answer:
    """The answer of one denoised canvas row; ``stopped_by`` is a cancel/deadline reason;
    ``held_until``: a rewrite's held tokens end there (see ``cut_at_eos``); ``confidence``: each canvas position's
    (None: not known), carried to the answer's characters (``confidence.confidence_runs``)."""
    positions, found_eos = kept_positions(canvas, loaded.eos_ids, loaded.pad_id, held_until)
    tokens = [canvas[index] for index in positions]
    if stopped_by is not None:
        stop = protocol.StopReason(stopped_by)
    else:
        stop = protocol.StopReason.EOS if found_eos else protocol.StopReason.LENGTH
    dropped = stop in (protocol.StopReason.CANCELLED, protocol.StopReason.SUPERSEDED)
    rounded: dict[str, Any] = {
        name: round(value, 3) if name.endswith("_ms") else int(value) for name, value in timings.items()
    }
    text = "" if dropped else loaded.decode(tokens)
    runs = []
    if confidence is not None and len(confidence) == len(canvas) and text:  # else not known: nothing is gated on it
        runs = confidence_runs(loaded.decode, tokens, [confidence[index] for index in positions], text)
    return Answer(text, stop, protocol.Timings(new_tokens=len(tokens), **rounded), runs)


def kept_positions(
    tokens: list[int], eos_ids: set[int], pad_id: int | None, held_until: int = 0
) -> tuple[list[int], bool]:
    """The positions of the tokens before the first end-of-sequence, and whether one was found; pads are dropped.

    Before ``held_until`` (a rewrite's last held token and what precedes it) an end-of-sequence is dropped like a
    pad, so that the held tokens always come back: the model shortens a segment before a held one that way.
    """
    out: list[int] = []
    for index, token in enumerate(tokens):
        if token in eos_ids and index >= held_until:
            return out, True
        if token != pad_id and token not in eos_ids:
            out.append(index)
    return out, False


def cut_at_eos(tokens: list[int], eos_ids: set[int], pad_id: int | None, held_until: int = 0) -> tuple[list[int], bool]:
    """The tokens before the first end-of-sequence, and whether one was found (``kept_positions``)."""
    positions, found = kept_positions(tokens, eos_ids, pad_id, held_until)
    return [tokens[index] for index in positions], found
