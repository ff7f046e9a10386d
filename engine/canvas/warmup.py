"""The compiled step's warm-up: the requests serving will make, run once so that their graphs are traced.

``diffgemma_engine.runtimes.own_loop`` hands :func:`trace_serving_shapes` to ``DecoderStep.start_compiling`` (gpt-fast's
shape: the caller decides to compile and warms up). The caches are built as serving builds them, views of a
``PrefixCache`` stacked by ``stack_rows`` for a batch, so the graphs traced here are the ones serving looks up.
"""

from __future__ import annotations

import torch

from .caches import PrefixCache, stack_rows
from .compiled import DecoderStep
from .denoise import denoise_canvas
from .runtime import execution_device, grad_mode, text_config_of
from .sampler import SamplerSettings

WARM_UP_CANVAS = 37
"""The warm-up's canvas length, and its batch's row count (3): sizes that no model dimension is likely to equal.
A size traced equal to another ("duck sizing": canvas 32 and a head dimension of 32, a batch of 2 and 2 heads)
is assumed equal to it from then on, and every other canvas length or batch size would miss the graph."""


def warm_up_prompts(sliding_window: int | None) -> tuple[tuple[int, ...], ...]:
    """Prompt lengths of the warm-up requests: one alone, a batch of three, and a batch of three equal prompts.

    Dynamic shapes specialise a size of 1, so a single request and a batch need a graph each; a batch whose
    prompts have equal lengths (candidates for one prompt, or prompts all at the length cap) has no padding, and
    its full-attention mask is None instead of a tensor: a third graph. The long prompt is longer than the sliding
    window, for the same reason as ``WARM_UP_CANVAS``: traced on equal lengths, the sliding and full layers'
    caches would be assumed equal and every longer prompt would miss.
    """
    long = (sliding_window or 32) + 16
    return ((long,), (long, 40, 41), (long, long, long))


def trace_serving_shapes(step: DecoderStep) -> None:
    """Run the engine's own loop on ``step`` (over the graphs being compiled), on the requests of
    ``warm_up_prompts``."""
    model, config = step.model, step.model.config
    device, canvas_length, vocab = execution_device(model), WARM_UP_CANVAS, text_config_of(config).vocab_size
    prefixes = PrefixCache(model)
    generator = torch.Generator(device=device).manual_seed(0)
    settings = SamplerSettings(max_steps=2)
    for lengths in warm_up_prompts(getattr(prefixes.text_config, "sliding_window", None)):
        views = [
            prefixes.prepare(row, torch.randint(0, vocab, (length,), generator=generator).tolist())[0]
            for row, length in enumerate(lengths)
        ]
        if len(views) == 1:
            cache, positions, decoder_mask = views[0], None, None
        else:
            with grad_mode(model)():
                cache, positions, decoder_mask = stack_rows(views, prefixes.text_config, canvas_length)
        denoise_canvas(
            model,
            cache,
            len(lengths),
            canvas_length,
            settings,
            generator,
            step=step,
            position_ids=positions,
            decoder_mask=decoder_mask,
        )
