"""The model's own denoising settings and token ids, checked when it loads: ``check_generation``.

transformers accepts any positive step count and any integer id, but the engine refuses every request past its own
caps (``protocol.MAX_STEPS``, ``protocol.MAX_CANVAS_LENGTH``) and an id outside the vocabulary fails inside the
model. A folder whose ``generation_config.json`` says ``max_denoising_steps: 1000000`` would load as ready and then
refuse every completion, unseen; one whose end-of-sequence id is past the vocabulary would fail every rewrite with
an ``IndexError``. Checked at load instead, each is a failed load naming the key (the language server shows it once,
as "model failed to load: ..."). Pure: plain values in, ``ModelLoadError`` out.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

from ..errors import ModelLoadError
from ..shared.protocol import MAX_CANVAS_LENGTH, MAX_STEPS

MAX_TEMPERATURE = 100.0
"""The highest sampling temperature accepted (the release's schedule runs from 0.8 down to 0.4)."""
SOURCE = "generation_config.json"


def _whole(key: str, value: object, low: int, high: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ModelLoadError(f"{SOURCE}: {key} must be a whole number from {low} to {high}, got {value!r}")


def _positive(key: str, value: object, high: float = math.inf) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or not 0 < value <= high
    ):
        limit = f"at most {high:g}" if high != math.inf else "finite"
        raise ModelLoadError(f"{SOURCE}: {key} must be a number more than 0 and {limit}, got {value!r}")
    return float(value)


def check_generation(
    settings: Mapping[str, object],
    *,
    eos_ids: Iterable[object],
    pad_id: object,
    vocab_size: int,
    tokenizer_size: int,
    canvas_length: int,
) -> None:
    """The sampler ``settings`` (``SamplerSettings`` as a dict) within the engine's caps, the end-of-sequence and
    padding ids and every id the tokenizer can produce (``tokenizer_size``) within the model's vocabulary, and the
    canvas within ``protocol.MAX_CANVAS_LENGTH``; ``ModelLoadError`` naming the key of the first that is not."""
    _whole("max_denoising_steps", settings["max_steps"], 1, MAX_STEPS)
    _whole("stability_threshold", settings["stability_threshold"], 0, MAX_STEPS)
    t_min = _positive("t_min", settings["t_min"], MAX_TEMPERATURE)
    t_max = _positive("t_max", settings["t_max"], MAX_TEMPERATURE)
    if t_max < t_min:
        raise ModelLoadError(f"{SOURCE}: t_max ({t_max:g}) must be at least t_min ({t_min:g})")
    _positive("sampler_config.entropy_bound", settings["entropy_bound"])
    _positive("confidence_threshold", settings["confidence_threshold"])
    for eos in eos_ids:
        _whole("eos_token_id", eos, 0, vocab_size - 1)
    if pad_id is not None:
        _whole("pad_token_id", pad_id, 0, vocab_size - 1)
    if tokenizer_size > vocab_size:
        raise ModelLoadError(
            f"the tokenizer has {tokenizer_size} tokens, more than the model's vocab_size of {vocab_size}: its ids "
            "past the vocabulary would fail inside the model"
        )
    if not 1 <= canvas_length <= MAX_CANVAS_LENGTH:
        raise ModelLoadError(f"config.json: canvas_length must be from 1 to {MAX_CANVAS_LENGTH}, got {canvas_length}")
