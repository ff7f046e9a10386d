"""One request as vLLM's OpenAI-compatible ``/v1/completions`` takes it, and its answer back.

What vLLM 0.33 accepts for DiffusionGemma (``vllm/utils/diffusion.py`` ``validate_diffusion_sampling_params``; the
per-request options travel in ``vllm_xargs``, which ``CompletionRequest.to_sampling_params`` carries into
``SamplingParams.extra_args``):

* ``prompt``: token ids, the same ids the engine's own layout builds, so vLLM's prefix cache keeps the stable head;
* ``diffusion_canvas_length``: a canvas narrower than the served one (the rest of a line);
* ``diffusion_seed_canvas``: the ids a rewrite's canvas starts from instead of noise, exactly the canvas wide, with
  the share its strength calls for already renoised by the engine; ``diffusion_pinned``: the positions held;
* ``diffusion_max_steps``: the steps to run (a deadline's step budget; a rewrite's part of its schedule);
* ``n`` for candidates, ``max_tokens`` one canvas;
* ``logprobs: 0``: each emitted token's logprob, which vLLM's DiffusionGemma runner (``diffusion_gemma.py``, its
  "stash" of the converging denoise step) takes from that step's temperature-scaled logits for the position's argmax:
  ``exp`` of it (``token_confidence``) is the token's probability at the last step, ``softmax(logits / T)`` at its
  argmax (the ``last`` signal of benchmarks/confidence_signals.py). Not the own loop's confidence (the share of the
  steps each token has stayed the argmax, ``canvas.sampler.stable_steps``): vLLM's runner keeps no per-position
  record of earlier steps (its compiled sample step holds the canvas, argmax, the stopper's history and
  self-conditioning) and its reply says nothing of them, so through vLLM a settled canvas reports about 1, wrong tokens
  included (benchmarks/README.md, "Which confidence"). Held positions report the model's argmax there, not the held
  token; the engine sets them to 1, as its own loop does (``request.on_vllm``).

Never ``seed``: vLLM refuses it for a diffusion model (HTTP 400 from ``SamplingParams._validate_diffusion``, run
with the served model's config at admission, with temperature, min_p, min_tokens, logit_bias, bad_words and
allowed_token_ids), so candidates through vLLM are not reproducible by seed (``SEEDS_REPRODUCE`` says so to
``doctor``). A rewrite's renoised start is drawn by the engine, with the seed, before it is sent.

The tests check every body built here with vLLM's own request model and validator (tests/support/vllm_check.py).
"""

from __future__ import annotations

import math
from typing import Any

import attrs

SEEDS_REPRODUCE = False
"""Whether a request's seed reproduces its answer through vLLM: no, vLLM takes no seed for a diffusion model."""
STEPS_UNREPORTED = (
    "vLLM does not report the denoising steps it ran (a settled canvas stops early): steps are shown as unknown and "
    "time per step is not learnt"
)
"""What doctor is told of the steps: vLLM's completion reply (0.32, 0.33: ``CompletionResponse``) says nothing of
them, so neither the step budget sent nor a guess is recorded as the steps run."""
CACHED_UNREPORTED = (
    "vLLM does not report the prompt tokens it read from its cache: start it with --enable-prompt-tokens-details"
)
"""What doctor is told when a reply's ``usage.prompt_tokens_details`` is null (vLLM without that option)."""


@attrs.frozen(kw_only=True)
class CanvasAsk:
    """One request's canvas as the engine has laid it out: what a runtime that runs canvases elsewhere is asked."""

    prompt_ids: list[int]
    canvas_length: int
    """This request's canvas width."""
    steps: int
    """Denoising steps to run: the schedule after a deadline's budget, or the part of it a rewrite's strength runs."""
    candidates: int = 1
    start_ids: list[int] | None = None
    """A rewrite's first canvas (``canvas_length`` ids), its renoised share drawn by the engine; None: from noise."""
    held: list[int] = attrs.field(factory=list)
    """Positions of ``start_ids`` held at their token through every step."""


def completion_body(ask: CanvasAsk, *, model: str, served_canvas: int) -> dict[str, Any]:
    """The JSON body of ``POST /v1/completions`` for ``ask``, served by vLLM at ``served_canvas`` wide, for
    ``model`` (the served model's name; "" for the one it serves)."""
    xargs: dict[str, Any] = {"diffusion_max_steps": ask.steps}
    if ask.canvas_length != served_canvas:
        xargs["diffusion_canvas_length"] = ask.canvas_length
    if ask.start_ids is not None:
        xargs["diffusion_seed_canvas"] = list(ask.start_ids)
        if ask.held:
            xargs["diffusion_pinned"] = list(ask.held)
    body: dict[str, Any] = {
        "prompt": list(ask.prompt_ids),
        "max_tokens": ask.canvas_length,
        "n": ask.candidates,
        "return_token_ids": True,
        "logprobs": 0,
        "skip_special_tokens": False,
        "vllm_xargs": xargs,
    }
    if model:  # else the one model the server serves
        body["model"] = model
    return body


REPLY_BYTES_PER_TOKEN = 64
"""A bound on what one token costs in a reply: its id in ``token_ids`` or ``prompt_token_ids`` (at most 7 digits and
a comma) and its share of ``text`` (a few bytes, escaped up to 6 each), with room to spare."""
REPLY_OVERHEAD_BYTES = 16 * 1024
"""A bound on the rest of a reply (ids, usage, finish reasons), per choice and once."""


def reply_bound(body: dict[str, Any]) -> int:
    """The most bytes a reply to ``body`` can need: each of its ``n`` choices carries at most the canvas
    (``max_tokens``) and the prompt's ids. A reply over it is refused, never decoded whole."""
    prompt = body.get("prompt")
    prompt_tokens = len(prompt) if isinstance(prompt, list) else len(str(prompt or ""))
    tokens = int(body.get("max_tokens") or 0) + prompt_tokens
    choices = int(body.get("n") or 1)
    return REPLY_OVERHEAD_BYTES * (choices + 1) + choices * tokens * REPLY_BYTES_PER_TOKEN


@attrs.frozen(kw_only=True)
class CanvasAnswer:
    """One choice of a completion: the canvas's ids as vLLM returned them, and why it ended."""

    token_ids: list[int]
    finished_by_length: bool
    """vLLM's ``finish_reason`` was ``length``: the canvas filled without an end-of-sequence."""
    confidence: list[float] | None = None
    """Each of ``token_ids``' probability at its last step (``exp`` of its logprob); None when the reply had none."""


@attrs.frozen(kw_only=True)
class CompletionReply:
    """What ``/v1/completions`` answered: the choices in order, and the prompt's cached share."""

    choices: list[CanvasAnswer]
    prompt_tokens: int
    cached_tokens: int | None
    """None: vLLM did not say (it does only with ``--enable-prompt-tokens-details``)."""


class ReplyError(ValueError):
    """A ``/v1/completions`` answer this runtime cannot read."""


def _object(value: object) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def token_confidence(logprobs: object, count: int) -> list[float] | None:
    """A choice's ``logprobs.token_logprobs`` as probabilities, one per token id; None when they are missing, not
    numbers, or not one per token (the confidence is then not known, and nothing is gated on it)."""
    values = _object(logprobs).get("token_logprobs")
    if not isinstance(values, list) or len(values) != count:
        return None
    if not all(isinstance(value, (int, float)) and not isinstance(value, bool) for value in values):
        return None
    return [min(1.0, math.exp(value)) for value in values]


def read_reply(body: object, candidates: int) -> CompletionReply:
    """The reply of ``completion_body``'s request, checked: ``candidates`` choices with their token ids (the
    request asked for them), in index order. ``ReplyError`` for anything else, whatever its shape."""
    try:
        return _read_reply(body, candidates)
    except (TypeError, ValueError, AttributeError) as exc:
        raise ReplyError(f"a completions reply of the wrong shape ({exc})") from None


def _read_reply(body: object, candidates: int) -> CompletionReply:
    reply = _object(body)
    if not isinstance(reply.get("choices"), list):
        raise ReplyError(f"not a completions reply: {str(body)[:200]!r}")
    choices = sorted((_object(choice) for choice in reply["choices"]), key=lambda choice: choice.get("index", 0))
    if len(choices) != candidates:
        raise ReplyError(f"asked for {candidates} choices, got {len(choices)}")
    answers = []
    for choice in choices:
        ids = choice.get("token_ids")
        if not isinstance(ids, list) or not all(isinstance(token, int) for token in ids):
            raise ReplyError("a choice without its token_ids")
        answers.append(
            CanvasAnswer(
                token_ids=ids,
                finished_by_length=choice.get("finish_reason") == "length",
                confidence=token_confidence(choice.get("logprobs"), len(ids)),
            )
        )
    usage = _object(reply.get("usage"))
    details = usage.get("prompt_tokens_details")
    return CompletionReply(
        choices=answers,
        prompt_tokens=int(usage.get("prompt_tokens") or 0),
        cached_tokens=int(_object(details).get("cached_tokens") or 0) if details is not None else None,
    )
