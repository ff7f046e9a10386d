"""The remote backend: infills from an OpenAI-compatible server (vLLM, or ``diffgemma-lsp openai`` on a shared
machine) instead of a local engine.

A FIM model is asked through ``/v1/completions`` (the text after the cursor in ``suffix``, or one FIM prompt
format); an instruction model such as the released DiffusionGemma-IT through ``/v1/chat/completions`` (prompt
format ``chat``), with the same user turn the engine's chat layout writes and thinking off, its answers then
unwrapped like the engine's (``layout`` is ``chat``).

It is a ``Backend`` (``backends/base.py``), as the local ``EngineClient`` is, so everything above it (debounce,
latest-wins, post-processing, reuse) is the same for both.
Cancelling an infill closes its HTTP request, which cancels the work on a server that watches for it.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import time
from typing import Any

import aiohttp
import attrs

from diffgemma_engine.shared import protocol
from diffgemma_engine.shared.prompt import chat_user_text, parts_of
from diffgemma_engine.shared.session_key import SESSION_HEADER, session_key
from diffgemma_lsp.backends.base import (
    BackendState,
    EngineRequestError,
    EngineUnavailable,
    RewriteUnsupported,
    StateListener,
    StateReporter,
)
from diffgemma_lsp.fim_formats import CHAT, DIFFUSION_GEMMA, SUFFIX_FIELD, format_named

logger = logging.getLogger(__name__)

DEFAULT_MAX_TOKENS = 64
"""``max_tokens`` for a completions format when the settings leave the canvas to the model (0): such a server may
decode token by token, and OpenAI's default is 16. The ``chat`` format sends none then, so that the server's
canvas is the model's own (256 for the release on vLLM), as the engine's and ``diffgemma-lsp openai``'s is for a
chat checkpoint: a fenced answer needs the room."""
MAX_ANSWER_BYTES = 1 << 20
"""A completions answer larger than this is refused unread (a completion is a few hundred tokens)."""
NO_DEADLINE_S = 30.0
"""How long a request without a deadline, or one the user asked for, may take."""
SLACK_S = 5.0
"""An HTTP request may take this much longer than the request's deadline (network, queueing) before it fails."""


class OpenAIBackend(StateReporter):
    """Infills over HTTP; ``model_id`` and ``layout`` describe the remote model once the server has answered."""

    def __init__(
        self,
        url: str,
        *,
        model: str = "",
        api_key_env: str = "",
        prompt_format: str = SUFFIX_FIELD,
        on_state: StateListener | None = None,
    ) -> None:
        super().__init__(BackendState.CONNECTING, on_state)
        self.url = url
        self.model = model
        self.api_key_env = api_key_env
        self.prompt_format = prompt_format
        self.model_id = ""
        """The model the server says answered (else the ``model`` setting); ``""`` until it has answered."""
        self.layout = protocol.Layout.NOT_KNOWN
        """``Layout.CHAT`` for the ``chat`` prompt format, else ``Layout.FIM``, once the server has answered."""
        self.canvas_length = 0
        """A completions server has no canvas: a next edit's window is not fitted to one."""
        self._session: aiohttp.ClientSession | None = None
        self._pending = 0
        self._ids = itertools.count(1)

    # -- lifecycle ---------------------------------------------------------------------------------------

    def start(self) -> None:
        """Open the HTTP session (connections are made per request and kept alive)."""
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(headers=self._headers())

    async def wait_ready(self, timeout_s: float) -> None:
        """At once: the server is tried by each request (an unreachable one fails that request, saying why)."""
        self.start()

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _headers(self) -> dict[str, str]:
        key = os.environ.get(self.api_key_env, "").strip() if self.api_key_env else ""
        return {"Authorization": f"Bearer {key}"} if key else {}

    # -- requests ----------------------------------------------------------------------------------------

    def pending_count(self) -> int:
        return self._pending

    def new_id(self) -> str:
        return str(next(self._ids))

    def as_rewrite(self, request: protocol.Infill) -> protocol.Infill:
        """For the ``chat`` format, ``request`` as it is: the chat turn shows the selection, marked, with the
        instruction (``engine/shared/prompt.py``). A completions API cannot start a canvas from text: for the other
        formats the selection is written anew between the same prefix and suffix, as a rewrite of strength 1 would be
        (the instruction, which a FIM prompt has no place for, is dropped). A refine of a shown suggestion is not
        served (``RewriteUnsupported``): the chat turn could only ask anew, which the completion does anyway."""
        if request.refine:
            raise RewriteUnsupported("a remote server cannot start a canvas from the shown suggestion")
        if self.prompt_format == CHAT:
            return request
        return attrs.evolve(request, start=[], strength=1.0, instruction="")

    def request_body(self, request: protocol.Infill) -> dict[str, Any]:
        """The request body for ``request`` in the configured prompt format: ``/v1/completions``, or
        ``/v1/chat/completions`` for ``chat``."""
        body: dict[str, Any] = {"stream": False}
        if request.canvas_length or self.prompt_format != CHAT:
            body["max_tokens"] = request.canvas_length or DEFAULT_MAX_TOKENS
        if self.model:
            body["model"] = self.model
        if request.candidates > 1:
            body["n"] = request.candidates
        fmt = format_named(self.prompt_format)
        if self.prompt_format == CHAT:
            body["messages"] = [{"role": "user", "content": chat_user_text(parts_of(request))}]
            body["chat_template_kwargs"] = {"enable_thinking": False}  # a completion has no time to think
        elif fmt is None:
            body["prompt"], body["suffix"] = request.prefix, request.suffix
        else:
            body["prompt"] = fmt.build(request.prefix, request.suffix)
            body["stop"] = [fmt.before, fmt.between] if fmt.before else [fmt.between]
        if self.prompt_format == DIFFUSION_GEMMA and (controls := diffusion_controls(request)):
            body["vllm_xargs"] = controls
        return body

    async def infill(self, request: protocol.Infill, *, explicit: bool = False) -> protocol.Result:
        """One completion from the server; raises EngineUnavailable when it cannot be had now (``explicit``: see
        ``Backend.infill``)."""
        self.start()
        assert self._session is not None
        deadline_s = request.deadline_ms / 1000 if request.deadline_ms and not explicit else NO_DEADLINE_S
        timeout = aiohttp.ClientTimeout(total=deadline_s + SLACK_S)
        started = time.perf_counter()
        self._pending += 1
        try:
            headers = {SESSION_HEADER: session_key(request.uri)}  # a cache-aware router keeps the file on one replica
            post = self._session.post(self.url, json=self.request_body(request), timeout=timeout, headers=headers)
            async with post as response:
                body = bytearray()
                async for chunk in response.content.iter_chunked(1 << 16):
                    body += chunk
                    if len(body) > MAX_ANSWER_BYTES:
                        break  # the rest is never read
                status = response.status
            if len(body) > MAX_ANSWER_BYTES:
                raise EngineRequestError(
                    protocol.Error(
                        code=protocol.ErrorCode.TOO_LARGE,
                        message=f"the completion server sent more than {MAX_ANSWER_BYTES} bytes: not a completion",
                    )
                )
            text = bytes(body).decode("utf-8", errors="replace")
        except (aiohttp.ClientError, TimeoutError) as exc:
            reason = f"the completion server {self.url} is unreachable: {exc or type(exc).__name__}"
            self._set_state(BackendState.DISCONNECTED, reason)
            raise EngineUnavailable(reason) from exc
        finally:
            self._pending -= 1
        elapsed_ms = (time.perf_counter() - started) * 1000
        return self._result(request.id, status, text, elapsed_ms)

    def _result(self, request_id: str, status: int, text: str, elapsed_ms: float) -> protocol.Result:
        message = _error_message(text)
        if status in (401, 403):
            env = f"${self.api_key_env}" if self.api_key_env else "the API key"
            reason = f"the completion server refused the API key (HTTP {status}: {message}); check {env}"
            self._set_state(BackendState.FAILED, reason)
            raise EngineUnavailable(reason)
        if status in (429, 503):
            raise EngineUnavailable(f"the completion server is busy or loading (HTTP {status}: {message})")
        if status >= 400:
            if status >= 500:
                self._set_state(BackendState.FAILED, f"the completion server failed (HTTP {status}: {message})")
                raise EngineUnavailable(message)
            raise EngineRequestError(protocol.Error(code=protocol.ErrorCode.BAD_REQUEST, message=message))
        try:
            body = _json(text)
            texts, finish_reason = _answers(body)
        except ValueError as exc:
            reason = f"the completion server sent an answer that is not a completion: {exc}"
            self._set_state(BackendState.FAILED, reason)
            raise EngineUnavailable(reason) from exc
        reported = body.get("usage")
        usage = reported if isinstance(reported, dict) else {}
        model = body.get("model")
        self.model_id = model if isinstance(model, str) and model else self.model
        self.layout = protocol.Layout.CHAT if self.prompt_format == CHAT else protocol.Layout.FIM
        self._set_state(BackendState.READY)
        return protocol.Result(
            id=request_id,
            text=texts[0],
            alternatives=[other for other in texts[1:] if other and other != texts[0]],
            stop=protocol.StopReason.LENGTH if finish_reason == "length" else protocol.StopReason.EOS,
            timings=protocol.Timings(
                denoise_ms=round(elapsed_ms, 1),
                prompt_tokens=_count(usage.get("prompt_tokens")),
                new_tokens=_count(usage.get("completion_tokens")),
            ),
        )


def diffusion_controls(request: protocol.Infill) -> dict[str, int]:
    """vLLM's per-request DiffusionGemma options (``vllm_xargs``, ``engine/vllm/completions.py``) for what the
    settings ask: the canvas width (``canvasLength``) and a cap on the denoising steps (``steps``); none: the served
    canvas and schedule. A server that is not vLLM ignores the field."""
    controls = {}
    if request.canvas_length:
        controls["diffusion_canvas_length"] = request.canvas_length
    if request.max_steps:
        controls["diffusion_max_steps"] = request.max_steps
    return controls


def _answers(body: dict[str, Any]) -> tuple[list[str], object]:
    """Each choice's text (``text`` in a completion, ``message.content`` in a chat completion) and the first one's
    ``finish_reason``; ValueError saying what is not as a completion has it."""
    choices = body.get("choices")
    if not isinstance(choices, list) or not choices:
        raise ValueError(f"'choices' is {_kind(choices)}, not a list of choices")
    texts: list[str] = []
    for choice in choices:
        if not isinstance(choice, dict):
            raise ValueError(f"a choice is {_kind(choice)}, not an object")
        message = choice.get("message")
        text = message.get("content") if isinstance(message, dict) else choice.get("text")
        if not isinstance(text, str):
            raise ValueError(f"a choice's text is {_kind(text)}, not a string")
        texts.append(text)
    return texts, choices[0].get("finish_reason")


def _kind(value: object) -> str:
    """How a wrong JSON value is named in a message."""
    if value is None:
        return "missing"
    return "an empty list" if value == [] else f"a {type(value).__name__}"


def _json(text: str) -> dict[str, Any]:
    """The JSON object ``text`` holds; ValueError for anything else (nesting too deep for the parser included)."""
    try:
        body = json.loads(text)
    except RecursionError:
        raise ValueError("its JSON is nested too deeply") from None
    if not isinstance(body, dict):
        raise ValueError("not a JSON object")
    return body


def _error_message(text: str) -> str:
    """The ``error.message`` of an OpenAI-style error body, else the start of the body."""
    try:
        error = _json(text).get("error")
        message = error.get("message") if isinstance(error, dict) else None
        if isinstance(message, str):
            return message
        if isinstance(error, str):
            return error
    except ValueError:
        pass
    return text.strip()[:200] or "no details"


def _count(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0
