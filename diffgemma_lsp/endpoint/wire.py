"""The OpenAI-compatible ``/v1/completions`` wire types: request checking, responses, errors. Pure: no I/O.

Only what code completion needs is honoured: ``prompt`` (one string; fill-in-the-middle sentinels or the
``suffix`` field carry the text after the cursor), ``max_tokens``, ``stop``, ``stream`` and ``n`` (up to
``MAX_CHOICES`` canvases denoised in one batch; only distinct answers come back, so there may be fewer). Sampling
fields (``temperature``, ``top_p``, ...) are accepted and ignored: the engine's sampler follows the checkpoint's
generation config. Unknown fields are ignored, as OpenAI-compatible servers do; wrong types are refused.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import attrs

from diffgemma_lsp.context import CHARS_PER_TOKEN

MAX_STOP_SEQUENCES = 4
MAX_CHOICES = 4


class ApiError(Exception):
    """A request the API refuses: HTTP ``status`` and an OpenAI-style error body."""

    def __init__(self, status: int, message: str, *, param: str | None = None, kind: str = "invalid_request_error"):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.kind = kind

    def body(self) -> dict[str, Any]:
        """``{"error": {...}}`` as OpenAI sends it."""
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": None}}


@attrs.frozen(kw_only=True)
class CompletionRequest:
    """A checked ``/v1/completions`` request."""

    model: str
    prompt: str
    suffix: str | None = None
    max_tokens: int | None = None
    """At most this many tokens; None: the model's canvas (not OpenAI's 16: a canvas is one pass anyway)."""
    stop: tuple[str, ...] = ()
    stream: bool = False
    n: int = 1


def _field(body: dict[str, Any], name: str, kinds: tuple[type, ...], default: Any) -> Any:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) and bool not in kinds or not isinstance(value, kinds):
        expected = " or ".join(kind.__name__ for kind in kinds)
        raise ApiError(400, f"'{name}' must be {expected}, got {type(value).__name__}", param=name)
    return value


def parse_completion_request(body: object) -> CompletionRequest:
    """Check a decoded JSON body; raise ApiError (400) that says what is wrong."""
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if not isinstance(prompt, str):
        raise ApiError(400, "'prompt' is required and must be a string (one prompt per request)", param="prompt")
    model = _field(body, "model", (str,), "")
    suffix = _field(body, "suffix", (str,), None)
    max_tokens = _field(body, "max_tokens", (int,), None)
    if max_tokens is not None and max_tokens < 1:
        raise ApiError(400, f"'max_tokens' must be 1 or more, got {max_tokens}", param="max_tokens")
    stop = _field(body, "stop", (str, list), [])
    stop = [stop] if isinstance(stop, str) else stop
    if len(stop) > MAX_STOP_SEQUENCES or not all(isinstance(item, str) and item for item in stop):
        raise ApiError(400, f"'stop' must be up to {MAX_STOP_SEQUENCES} non-empty strings", param="stop")
    n = _field(body, "n", (int,), 1)
    if not 1 <= n <= MAX_CHOICES:
        raise ApiError(400, f"'n' must be between 1 and {MAX_CHOICES}, got {n}", param="n")
    if _field(body, "best_of", (int,), n) != n:
        raise ApiError(400, "'best_of' is not supported (leave it out, or equal to 'n')", param="best_of")
    if _field(body, "echo", (bool,), False):
        raise ApiError(400, "'echo' is not supported", param="echo")
    stream = _field(body, "stream", (bool,), False)
    return CompletionRequest(
        model=model, prompt=prompt, suffix=suffix, max_tokens=max_tokens, stop=tuple(stop), stream=stream, n=n
    )


def cut_at_stop(text: str, stop: tuple[str, ...]) -> tuple[str, bool]:
    """``text`` up to the first stop sequence, and whether one was found."""
    cut = min((index for sequence in stop if (index := text.find(sequence)) >= 0), default=-1)
    return (text[:cut], True) if cut >= 0 else (text, False)


def cut_to_tokens(text: str, max_tokens: int | None) -> tuple[str, bool]:
    """``text`` cut to about ``max_tokens`` tokens (``CHARS_PER_TOKEN`` characters each: the language server has no
    tokenizer) at the end of its last whole line within them (the first line at least), and whether it was cut. For
    a chat checkpoint, whose canvas is its own whatever the client asks (``endpoint.server.canvas_for``)."""
    limit = max_tokens * CHARS_PER_TOKEN if max_tokens is not None else len(text)
    if len(text) <= limit:
        return text, False
    end = text.rfind("\n", 0, limit + 1)
    if end <= 0:
        end = text.find("\n")
    return (text[:end], True) if end > 0 else (text, False)


def new_completion_id() -> str:
    return f"cmpl-{uuid.uuid4().hex}"


def completion_body(
    completion_id: str,
    model: str,
    choices: list[tuple[str, str]],
    prompt_tokens: int,
    completion_tokens: int,
) -> dict[str, Any]:
    """A ``text_completion`` object; ``choices`` holds (text, finish reason) pairs."""
    return {
        "id": completion_id,
        "object": "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {"index": index, "text": text, "finish_reason": finish, "logprobs": None}
            for index, (text, finish) in enumerate(choices)
        ],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
    }


def models_body(model: str) -> dict[str, Any]:
    """``GET /v1/models``: the one model this server runs."""
    return {"object": "list", "data": [{"id": model, "object": "model", "created": 0, "owned_by": "diffgemma"}]}
