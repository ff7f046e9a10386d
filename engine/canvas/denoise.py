"""One infill canvas: the encoder's prefill, then the denoising loop, ``diffgemma_engine.canvas.loop.run_steps`` over
the one step (``diffgemma_engine.canvas.step.denoise_step``), which stops between steps.

It computes what ``DiffusionGemmaForBlockDiffusion.generate`` computes for a single canvas (with ``exact``, the
same random stream and the same tokens for the same seed and settings; ``tests/engine/test_parity.py`` holds it
to that; from a rewrite's start it is ``generate`` from ``decoder_input_ids`` on the matching part of the schedule,
``tests/engine/test_rewrite.py``), with five differences an engine needs:

* ``should_stop`` is asked before every step, so a cancel or a deadline ends the work within one step;
* the entropy of each step is computed once and shared by the sampler and the stopping rule;
* any canvas length, per call, without touching the shared ``model.config``;
* by default (``exact`` off) it draws samples only for the positions the entropy bound accepts;
* a rewrite (``StartCanvas``) starts from given tokens, a share of them renoised, part-way down the schedule, and
  may hold positions fixed.

Which code denoises a canvas: :func:`run_canvas` hands it to a captured graph (``diffgemma_engine.canvas.captured``)
where one serves its shape, else :func:`denoise_canvas` runs the step eagerly: with ``exact``, op by op with the exact
sampler; otherwise with the fast sampler and the decoder pass of ``diffgemma_engine.canvas.compiled.DecoderStep``
(compiled once warmed up). All three run ``denoise_step``. The canvas is token ids; ``diffgemma_engine.request.infill``
cuts it at the first end-of-sequence token and decodes it.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import torch
from transformers import DynamicCache

from .caches import PrefixCache, encode_prompt
from .compiled import DecoderStep
from .loop import Denoised, StopCheck, run_steps
from .runtime import execution_device, grad_mode, text_config_of, under_grad_mode
from .sampler import AcceptedOnlySampler, ExactSampler, Sampler, SamplerSettings, StepNoise
from .start import StartCanvas, first_step
from .step import PromptView, ScorePass, StepParts, eager_scores, initial_state, step_of

if TYPE_CHECKING:
    from transformers import DiffusionGemmaForBlockDiffusion


@dataclass
class CanvasOutput:
    """What one canvas produced."""

    tokens: torch.Tensor  # (B, C) argmax canvas of the last step
    steps: int
    stopped_by: str | None  # the reason from ``should_stop``, None if the loop ran to its end
    encode_ms: float
    denoise_ms: float
    finished: torch.Tensor = field(repr=False)  # (B,) rows that met the stable-and-confident rule
    cached_tokens: int = 0  # prompt tokens whose encoding was reused
    confidence: torch.Tensor | None = field(default=None, repr=False)  # (B, C) float32, as ``Denoised.confidence``


def _now_ms() -> float:
    return time.perf_counter() * 1000.0


@under_grad_mode  # inference mode, or no_grad for torchao's tensors (diffgemma_engine.loading.quantize)
def denoise_canvas(
    model: DiffusionGemmaForBlockDiffusion,
    cache: DynamicCache,
    batch_size: int,
    canvas_length: int,
    settings: SamplerSettings,
    generator: torch.Generator | None = None,
    should_stop: StopCheck | None = None,
    on_step: Callable[[int], None] | None = None,
    *,
    position_ids: torch.Tensor | None = None,
    decoder_mask: torch.Tensor | None = None,
    row_checks: Sequence[StopCheck] | None = None,
    step: DecoderStep | None = None,
    start: StartCanvas | None = None,
) -> Denoised:
    """Denoise one canvas per row against an encoded ``cache``, running ``denoise_step`` eagerly.

    With a ``start`` (a rewrite) the canvas starts from its tokens, a share ``start.strength`` of the positions not
    held renoised (``renoise_start``), and the loop starts at the matching step of the schedule (``start_step``),
    so that fewer steps run; ``start.fixed`` positions keep their tokens at every step. Without one, the canvas
    starts from noise at step ``settings.max_steps``, as ``generate`` does.

    ``step`` runs the decoder and scores its logits for the fast sampler (default: eagerly; the engine passes its
    own, compiled once warmed up). With ``settings.exact`` the step is always eager with the exact sampler, as
    ``generate`` runs it.

    For a batch of requests with prompts of different lengths (``diffgemma_engine.request.batch``), ``position_ids`` (B,
    C) gives each row's canvas positions, ``decoder_mask`` (B, L + C) hides the padding of the shorter rows' caches, and
    ``row_checks`` stop rows one by one (a stopped row is frozen like a settled one).
    """
    device = execution_device(model)
    vocab_size = text_config_of(model.config).vocab_size
    cache_length = cache.get_seq_length()
    shape = (batch_size, canvas_length)
    if position_ids is None:
        position_ids = torch.arange(cache_length, cache_length + canvas_length, dtype=torch.int32, device=device)
        position_ids = position_ids.unsqueeze(0)
    if decoder_mask is None:
        decoder_mask = torch.ones((batch_size, cache_length + canvas_length), dtype=torch.bool, device=device)
    embed_dtype = model.model.decoder.embed_tokens.weight.dtype
    state = initial_state(
        batch_size, canvas_length, vocab_size, settings, embed_dtype, device, generator, start, fixed_shapes=False
    )
    masks = model.model.decoder.create_diffusion_decoder_attention_mask(
        config=model.config,
        inputs_embeds=state.canvas.unsqueeze(-1),
        cache=cache,
        decoder_attention_mask=decoder_mask,
    )
    score, sampler, noise = _scoring(model, settings, step, generator, shape, vocab_size)
    run = step_of(StepParts(score, sampler, settings, embed_dtype))
    inputs = PromptView(cache, masks, position_ids)
    steps = first_step(start, settings.max_steps)
    return run_steps(run, inputs, state, steps, noise, should_stop, on_step, row_checks)


def _scoring(
    model: DiffusionGemmaForBlockDiffusion,
    settings: SamplerSettings,
    step: DecoderStep | None,
    generator: torch.Generator | None,
    shape: tuple[int, int],
    vocab_size: int,
) -> tuple[ScorePass, Sampler, Callable[[], StepNoise] | None]:
    """The scoring pass, sampler and noise of an eager loop: with ``settings.exact``, ``generate``'s (op by op, the
    exact sampler, noise drawn whole each step); else the fast sampler over ``step`` (compiled once warmed up)."""
    if settings.exact:
        sampler = ExactSampler()
        noise = functools.partial(StepNoise.draw, *shape, vocab_size, execution_device(model), generator)
        return eager_scores(model, sampler), sampler, noise
    return (step or DecoderStep(model)).score_pass(), AcceptedOnlySampler(generator), None


class CanvasLoop(Protocol):
    """Another loop for some canvases (``diffgemma_engine.canvas.captured.CapturedLoop``: a graph captured per
    shape)."""

    def serves(self, rows: int, canvas_length: int, prompt_length: int, settings: SamplerSettings) -> bool:
        """Whether it serves this canvas; the eager loop does otherwise."""
        ...

    def denoise(
        self,
        views: Sequence[DynamicCache],
        canvas_length: int,
        settings: SamplerSettings,
        generator: torch.Generator | None = None,
        should_stop: StopCheck | None = None,
        on_step: Callable[[int], None] | None = None,
        row_checks: Sequence[StopCheck] | None = None,
        start: StartCanvas | None = None,
    ) -> Denoised:
        """One canvas per view, as ``denoise_canvas`` would denoise it."""
        ...


def run_canvas(
    model: DiffusionGemmaForBlockDiffusion,
    prompt_ids: torch.Tensor,
    canvas_length: int,
    settings: SamplerSettings,
    generator: torch.Generator | None = None,
    should_stop: StopCheck | None = None,
    on_step: Callable[[int], None] | None = None,
    prefix_cache: PrefixCache | None = None,
    cache_key: Hashable | None = None,
    step: DecoderStep | None = None,
    start: StartCanvas | None = None,
    loop: CanvasLoop | None = None,
) -> CanvasOutput:
    """Encode ``prompt_ids`` (B, P), then denoise one canvas of ``canvas_length`` (from noise, or from ``start``:
    see ``denoise_canvas``), with ``loop`` where it serves the canvas (one row, nothing held).

    With a ``prefix_cache`` and a ``cache_key`` (batch size 1), the tokens shared with that key's previous
    prompt are not encoded again.
    """
    began = _now_ms()
    cached = 0
    if prefix_cache is not None and cache_key is not None and prompt_ids.shape[0] == 1:
        cache, cached = prefix_cache.prepare(cache_key, prompt_ids[0].tolist())
    else:
        cache = DynamicCache(config=model.config.get_text_config(decoder=True))
        with grad_mode(model)():
            encode_prompt(model, prompt_ids, cache)
    encoded = _now_ms()
    rows, held = prompt_ids.shape[0], start is not None and start.fixed is not None
    if loop is not None and rows == 1 and not held and loop.serves(rows, canvas_length, prompt_ids.shape[1], settings):
        denoised = loop.denoise([cache], canvas_length, settings, generator, should_stop, on_step, start=start)
    else:
        denoised = denoise_canvas(
            model, cache, rows, canvas_length, settings, generator, should_stop, on_step, step=step, start=start
        )
    return CanvasOutput(
        tokens=denoised.tokens,
        steps=denoised.steps,
        stopped_by=denoised.stopped_by,
        encode_ms=encoded - began,
        denoise_ms=_now_ms() - encoded,
        finished=denoised.finished,
        cached_tokens=cached,
        confidence=denoised.confidence,
    )
