"""One infill canvas: encoder prefill, then the denoising loop, written out so it can stop between steps.

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

The loop, for a batch of B rows and a canvas of C tokens::

    1. encode the prompt into a DynamicCache                       (B, P) -> cache
    2. canvas <- uniform random tokens                             (B, C)
       (a rewrite: its start, a share ``strength`` of the positions not held replaced by random tokens)
    3. for step = N .. 1                                           (a rewrite: from ceil(strength * N))
       a. logits <- decoder(canvas, cache, self-conditioning)      (B, C, V)
       b. logits /= t_min + (t_max - t_min) * step / N             temperature schedule
       c. sample <- a draw from softmax(logits); best <- argmax(logits)
       d. accept the lowest-entropy positions whose summed entropy stays within the bound: they take
          ``sample``; every other position is renoised with a fresh random token
       e. a row is done when ``best`` equals the previous step's and the mean entropy is under the threshold
       (held positions take their start token in ``best`` and the canvas, and count as certain in c and d)
    4. the canvas is ``best`` of the last step, as token ids (``engine.infill`` cuts it at the first
       end-of-sequence token and decodes it)

The sampler's parts are in ``engine.canvas.sampler``, the caches (the prefill of step 1 among them) in
``engine.canvas.caches``, and the decoder pass of step 3a in ``engine.canvas.step``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import torch
from transformers import DynamicCache

from ..checkpoint_files import text_config_of
from ..placement import execution_device
from ..quantize import grad_mode, under_grad_mode
from .caches import PrefixCache, encode_prompt
from .sampler import SamplerSettings, Scores, accept_mask, sample_accepted
from .step import DecoderStep

if TYPE_CHECKING:
    from transformers import DiffusionGemmaForBlockDiffusion

StopCheck = Callable[[], str | None]
"""Returns a reason to stop (e.g. "cancelled") or None to go on."""


PIN_LOGIT = -1.0e4
"""A held position's logits: this for every token but its own (0), a one-hot softmax in any float dtype."""


@dataclass
class StartCanvas:
    """A canvas to start from instead of noise (a rewrite)."""

    tokens: torch.Tensor  # (B, C) token ids: the text to rewrite, as the canvas would hold it
    fixed: torch.Tensor | None = None  # (B, C) bool: positions held at their token through every step
    strength: float = 1.0  # the share of the positions not held that are renoised at the start, in (0, 1]


def share_of(strength: float, count: int) -> int:
    """``ceil(strength * count)``, without a float's last bit rounding 0.7 * 10 up to 8."""
    return math.ceil(round(strength * count, 6))


def start_step(strength: float, max_steps: int) -> int:
    """The step of the schedule (counting down ``max_steps`` .. 1) a canvas renoised by ``strength`` starts at:
    ``ceil(strength * max_steps)``, at least 1 (a light touch runs few steps; 1 runs them all)."""
    return min(max_steps, max(1, share_of(strength, max_steps)))


def renoise_start(start: StartCanvas, vocab_size: int, generator: torch.Generator | None) -> torch.Tensor:
    """The first canvas of a rewrite (B, C): in each row ``ceil(strength * free)`` of its ``free`` positions (those
    not held), drawn with ``generator``, take a uniform random token (the sampler's own noise); the rest keep their
    start tokens."""
    tokens = start.tokens
    free = torch.ones_like(tokens, dtype=torch.bool) if start.fixed is None else ~start.fixed
    counts = torch.tensor([share_of(start.strength, int(n)) for n in free.sum(dim=-1).tolist()], device=tokens.device)
    order = torch.rand(tokens.shape, generator=generator, device=tokens.device).masked_fill(~free, 2.0)
    ranks = order.argsort(dim=-1).argsort(dim=-1)  # held positions rank last: never chosen
    chosen = ranks < counts[:, None]
    noise = torch.randint(0, vocab_size, tokens.shape, device=tokens.device, generator=generator)
    return torch.where(chosen, noise, tokens)


def pin_logits(logits: torch.Tensor, fixed: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """``logits`` (B, C, V), changed in place, certain of ``tokens`` at the ``fixed`` positions (B, C): their argmax
    and sample are the token, their entropy 0 (no weight in the entropy bound or the stopping rule), and the next
    step's self-conditioning sees the token itself."""
    rows = fixed.nonzero(as_tuple=True)
    pinned = torch.full((rows[0].numel(), logits.shape[-1]), PIN_LOGIT, dtype=logits.dtype, device=logits.device)
    pinned.scatter_(1, tokens[rows].unsqueeze(-1), 0.0)
    logits[rows] = pinned
    return logits


def _pin_scores(scores: Scores, fixed: torch.Tensor, tokens: torch.Tensor) -> Scores:
    """``scores`` with the ``fixed`` positions certain of ``tokens`` (see ``pin_logits``). Their probabilities are
    left as they were: what is drawn there is replaced by the token anyway."""
    logits = pin_logits(scores.logits, fixed, tokens)
    best = torch.where(fixed, tokens, scores.best)
    entropy = scores.entropy.masked_fill(fixed, 0.0)
    return Scores(logits, best, scores.probs, entropy)


@dataclass
class Denoised:
    """What the denoising loop produced."""

    tokens: torch.Tensor  # (B, C) argmax canvas of the last step
    steps: int  # steps run
    stopped_by: str | None  # the reason from ``should_stop``, None if the loop ended on its own
    finished: torch.Tensor  # (B,) rows that settled (or were stopped by their row check)
    row_steps: list[int]  # steps each row took part in
    row_stops: list[str | None]  # each row's stop reason from its row check


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


def _now_ms() -> float:
    return time.perf_counter() * 1000.0


def _entropy(logits: torch.Tensor) -> torch.Tensor:
    """Per position, the entropy of the softmax of ``logits`` (..., V), computed as ``generate`` computes it."""
    distribution: torch.distributions.Distribution = torch.distributions.Categorical(logits=logits)
    return distribution.entropy()  # Distribution's annotated method (Categorical's override is unannotated)


@under_grad_mode  # inference mode, or no_grad for torchao's tensors (engine.quantize)
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
    """Denoise one canvas per row against an encoded ``cache``.

    With a ``start`` (a rewrite) the canvas starts from its tokens, a share ``start.strength`` of the positions not
    held renoised (``renoise_start``), and the loop starts at the matching step of the schedule (``start_step``),
    so that fewer steps run; ``start.fixed`` positions keep their tokens at every step. Without one, the canvas
    starts from noise at step ``settings.max_steps``, as ``generate`` does.

    ``step`` runs the decoder and scores its logits (default: eagerly; the engine passes its own, compiled once
    warmed up). With ``settings.exact`` the step is always eager, as ``generate`` runs it.

    For a batch of requests with prompts of different lengths (``engine.batch``), ``position_ids`` (B, C) gives
    each row's canvas positions, ``decoder_mask`` (B, L + C) hides the padding of the shorter rows' caches, and
    ``row_checks`` stop rows one by one (a stopped row is frozen like a settled one).
    """
    device = execution_device(model)
    vocab_size = text_config_of(model.config).vocab_size
    step = step or DecoderStep(model)
    cache_length = cache.get_seq_length()
    shape = (batch_size, canvas_length)
    if position_ids is None:
        position_ids = torch.arange(cache_length, cache_length + canvas_length, dtype=torch.int32, device=device)
        position_ids = position_ids.unsqueeze(0)
    if decoder_mask is None:
        decoder_mask = torch.ones((batch_size, cache_length + canvas_length), dtype=torch.bool, device=device)
    row_stops: list[str | None] = [None] * batch_size
    row_steps = [0] * batch_size
    pin: tuple[torch.Tensor, torch.Tensor] | None = None  # (held positions, their tokens), both (B, C)
    if start is None:
        canvas = torch.randint(0, vocab_size, shape, device=device, generator=generator)
        first_step = settings.max_steps
    else:
        canvas = renoise_start(start, vocab_size, generator)
        first_step = start_step(start.strength, settings.max_steps)
        if start.fixed is not None and bool(start.fixed.any()):
            pin = (start.fixed, start.tokens)
    mask_mapping = model.model.decoder.create_diffusion_decoder_attention_mask(
        config=model.config,
        inputs_embeds=canvas.unsqueeze(-1),
        cache=cache,
        decoder_attention_mask=decoder_mask,
    )
    embed_dtype = model.model.decoder.embed_tokens.weight.dtype
    best = canvas
    self_conditioning = None
    finished = torch.zeros(batch_size, dtype=torch.bool, device=device)
    history = torch.full((settings.stability_threshold, *shape), -1, dtype=torch.long, device=device)
    steps = 0
    for remaining in range(first_step, 0, -1):
        if should_stop is not None and (reason := should_stop()) is not None:
            return Denoised(best, steps, reason, finished, row_steps, [reason] * batch_size)
        for row, check in enumerate(row_checks or ()):
            if not finished[row] and (reason := check()) is not None:
                finished[row], row_stops[row] = True, reason
        if bool(finished.all()):
            break
        steps += 1
        for row in range(batch_size):
            row_steps[row] += not bool(finished[row])
        # The same arithmetic as transformers' LinearTemperatureScheduleLogitsProcessor (an int32 step tensor).
        step_tensor = torch.tensor(remaining, dtype=torch.int32, device=device)
        temperature = settings.t_min + (settings.t_max - settings.t_min) * (step_tensor / settings.max_steps)
        if settings.exact:
            logits = step.forward(canvas, self_conditioning, mask_mapping, cache, position_ids) / temperature
            if pin is not None:
                logits = pin_logits(logits, *pin)
            new_best = torch.argmax(logits, dim=-1)
            probs = torch.softmax(logits, dim=-1, dtype=torch.float32)
            sample = torch.multinomial(probs.view(-1, vocab_size), 1, generator=generator).view(shape)
            entropy = _entropy(logits)  # (B, C), once per step
            accepted = accept_mask(entropy, settings.entropy_bound)
        else:
            scores = step(canvas, self_conditioning, mask_mapping, cache, position_ids, temperature)
            if pin is not None:
                scores = _pin_scores(scores, *pin)
            if not finished.any():
                self_conditioning = None  # consumed: not held while this step samples (rows that are done need it)
            logits, new_best, entropy = scores.logits, scores.best, scores.entropy
            sample, accepted = sample_accepted(scores, canvas, settings.entropy_bound, generator)
            del scores  # its probabilities: only the logits go on, as the next step's self-conditioning
        kept = torch.where(accepted, sample, canvas)
        noise = torch.randint(0, vocab_size, shape, device=device, generator=generator)
        new_canvas = torch.where(accepted, kept, noise)
        if pin is not None:  # held, accepted or not (``best`` already is: the pinned logits' argmax is the token)
            new_canvas = torch.where(pin[0], pin[1], new_canvas)
        if finished.any():  # rows that are done keep their canvas and logits
            new_best = torch.where(finished[:, None], best, new_best)
            new_canvas = torch.where(finished[:, None], canvas, new_canvas)
            if self_conditioning is not None:
                logits = torch.where(finished[:, None, None], self_conditioning, logits)
                entropy = _entropy(logits)
        if settings.stability_threshold == 0:
            stable = torch.ones(batch_size, dtype=torch.bool, device=device)
        else:
            stable = (history == new_best[None]).all(dim=-1).all(dim=0)
            history = torch.roll(history, shifts=-1, dims=0)
            history[-1] = new_best
        finished |= stable & (entropy.mean(dim=-1) < settings.confidence_threshold)
        best, canvas, self_conditioning = new_best, new_canvas, logits.to(embed_dtype)
        if on_step is not None:
            on_step(steps)
        if bool(finished.all()):
            break
    return Denoised(best, steps, None, finished, row_steps, row_stops)


class CanvasLoop(Protocol):
    """Another loop for some canvases (``engine.canvas.captured.CapturedLoop``: a graph captured per shape)."""

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
    )
