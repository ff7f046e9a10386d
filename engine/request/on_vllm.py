"""One request run by a vLLM server (``serve --runtime vllm``): laid out by the engine as its own loop would run it
(``canvas_ask``), sent to vLLM, and each choice cut at its end and decoded as a canvas row is (``infill.finish_row``).

A cancel or a newer request for the document closes the connection, and vLLM aborts the request. A deadline is a
step budget sent ahead (``diffusion_max_steps``), not a stop on the way: vLLM runs at most what it was asked, and
fewer when the canvas settles. Its reply does not say how many, so the steps are recorded as unknown (0) and the
step clock learns nothing from the budget (it would learn a time per step several times too small)."""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, wait

from ..canvas.loop import StopCheck
from ..loading.model import LoadedModel
from ..shared import protocol
from ..shared.session_key import session_key
from ..vllm.client import VllmError, VllmServer, one_line
from ..vllm.completions import (
    CACHED_UNREPORTED,
    STEPS_UNREPORTED,
    CanvasAnswer,
    ReplyError,
    completion_body,
    read_reply,
)
from .canvas_ask import canvas_ask
from .infill import Answer, StartRow, finish_row
from .windows import each_window

STOPS_ON_THE_WAY = (protocol.StopReason.CANCELLED.value, protocol.StopReason.SUPERSEDED.value)


def with_held(ids: list[int], row: StartRow | None, decode: Callable[[list[int]], str]) -> list[int]:
    """``ids`` (a choice's tokens), or, where their text up to the start's last held token does not begin with the
    start's, ``ids`` with the held tokens put back at their places. vLLM holds a pinned position's seed token in the
    canvas it denoises (``diffusion_pinned``) but emits its own argmax there, so a held token the model would not
    have written (the text a user typed into a suggestion, ``diffgemma_lsp.refine``) came back changed; where its
    argmax only spells the held text with other tokens (``"\\n   "`` for a held ``"\\n"``), its tokens are kept, so that
    what follows still joins them. A reply that ends before the last held token gets the rest of the start."""
    if row is None or not any(row.held):
        return ids
    if decode(ids[: row.held_until]).startswith(decode(row.tokens[: row.held_until])):
        return ids
    out = [*ids, *row.tokens[len(ids) : row.held_until]]
    return [row.tokens[i] if i < len(row.held) and row.held[i] else token for i, token in enumerate(out)]


def run_on_vllm(
    loaded: LoadedModel,
    request: protocol.Infill,
    server: VllmServer,
    model_name: str,
    should_stop: StopCheck | None = None,
    time_left_ms: float | None = None,
    notes: set[str] | None = None,
    wait_until: Callable[[], float | None] | None = None,
) -> list[Answer]:
    """The answer of each of the request's candidates, in order (one, empty, when it was cancelled or superseded,
    or when the reply was not in by ``wait_until()``'s monotonic time: a ``deadline`` stop, and vLLM drops the
    request). What the reply did not report is added to ``notes`` (for doctor). ``VllmError`` with a one-line
    message when vLLM refused the request or its reply cannot be read."""
    ask, laid = canvas_ask(loaded, request, time_left_ms)
    body = completion_body(ask, model=model_name, served_canvas=loaded.canvas_length)

    def cancelled() -> str | None:
        reason = should_stop() if should_stop is not None else None
        if reason in STOPS_ON_THE_WAY:
            return reason
        limit = wait_until() if wait_until is not None else None
        return protocol.StopReason.DEADLINE.value if limit is not None and time.monotonic() >= limit else None

    started = time.perf_counter()
    reply, stopped = server.complete(body, cancelled, session=session_key(request.uri))
    denoise_ms = (time.perf_counter() - started) * 1000.0
    if stopped is not None:
        timings = protocol.Timings(tokenize_ms=round(laid.tokenize_ms, 3), denoise_ms=round(denoise_ms, 3))
        return [Answer("", protocol.StopReason(stopped), timings)]
    try:
        answer = read_reply(reply, ask.candidates)
    except ReplyError as exc:
        raise VllmError(f"vLLM's reply could not be read: {one_line(str(exc))}") from None
    if notes is not None:
        notes.add(STEPS_UNREPORTED)
        if answer.cached_tokens is None:
            notes.add(CACHED_UNREPORTED)
    held_until = laid.row.held_until if laid.row is not None else 0
    answers = []
    for choice in answer.choices:
        ids, confidence = _choice_ids(loaded, choice, laid.row)
        answers.append(
            finish_row(
                loaded,
                ids,
                None,
                held_until,
                confidence=confidence,
                tokenize_ms=laid.tokenize_ms,
                denoise_ms=denoise_ms,
                steps=0,  # not known: vLLM does not say
                prompt_tokens=answer.prompt_tokens,
                cached_tokens=answer.cached_tokens or 0,
            )
        )
    return answers


def _choice_ids(
    loaded: LoadedModel, choice: CanvasAnswer, row: StartRow | None
) -> tuple[list[int], list[float] | None]:
    """One choice's canvas ids as the own loop would hand them to ``finish_row`` (held tokens put back, the
    end-of-sequence vLLM stopped on but did not return added) and each one's confidence, if vLLM reported it."""
    ids, confidence = with_held(choice.token_ids, row, loaded.decode), choice.confidence
    held = row.held if row is not None else []
    if confidence is not None:  # a held position (put back or not) is certain of its token, as in the own loop
        confidence = [*confidence, *[1.0] * (len(ids) - len(confidence))]
        confidence = [1.0 if index < len(held) and held[index] else value for index, value in enumerate(confidence)]
    end = min(loaded.eos_ids) if loaded.eos_ids else None
    if not choice.finished_by_length and end is not None and not set(ids) & loaded.eos_ids:
        ids = [*ids, end]  # vLLM stopped on an end-of-sequence it did not return
        confidence = None if confidence is None else [*confidence, 1.0]
    return ids, confidence


def run_windows_on_vllm(request: protocol.Infill, run: Callable[[protocol.Infill], list[Answer]]) -> list[list[Answer]]:
    """Each window's answers (``diffgemma_engine.request.windows.each_window``'s order): ``run`` (``run_on_vllm``
    with the job's server, stop check and deadline) for every window at once, each on a thread of its own, so that
    vLLM has them all in flight together and batches them; the first ``VllmError`` is raised once all have ended."""
    requests = each_window(request)
    with ThreadPoolExecutor(max_workers=len(requests), thread_name_prefix="diffgemma-vllm-window") as pool:
        pending = [pool.submit(run, window) for window in requests]
        wait(pending)
    return [done.result() for done in pending]
