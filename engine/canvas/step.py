"""The denoising step, stated once: every way the engine runs a canvas calls :func:`denoise_step`.

A step takes the loop's state (:class:`StepState`: canvas, answer so far, self-conditioning logits, stability
history, finished rows, the schedule's counter) to the next one, against the encoded prompt
(:class:`DecoderInputs`)::

    1. scores <- the decoder's logits for the canvas (self-conditioned on the last step's), at the temperature
       t_min + (t_max - t_min) * step / N, scored by the sampler                        (B, C, V) -> Scores
    2. held positions (a rewrite's kept segments) are certain of their tokens
    3. accepted <- the lowest-entropy positions whose summed entropy stays within the bound
    4. sample, renoise <- the sampler's draws
    5. canvas <- sample where accepted, renoise elsewhere, the held tokens where held
    6. rows already finished keep their canvas and answer (their logits are the next step's self-conditioning,
       which only they read, and what they compute is not kept)
    7. finished |= stable over the last S steps and confident (``sampler.settled``)
    8. stable <- the steps in a row, this one included, each position's argmax has been its answer token;
       finished rows keep theirs (``sampler.stable_steps``; the loop reports it as a share of the row's steps, the
       answer's confidence)

What varies is passed in (:class:`StepParts`): how the logits are computed and scored (the model's forward, eager,
or ``diffgemma_engine.canvas.compiled.DecoderStep`` once compiled), and the sampler (``sampler.ExactSampler``, whose
random numbers are drawn before the step, or ``sampler.AcceptedOnlySampler``). The ways to run it:

* eagerly, op by op (``step_of``): the CPU's loop, with the fast sampler;
* with the decoder pass compiled (``DecoderStep``, dynamic shapes, in the background);
* the whole step compiled as one graph per serving shape, a CUDA graph on a GPU
  (``diffgemma_engine.canvas.captured.compile_step``): with the exact sampler, nothing in the step reads back to the
  host.

The host loop around it, which asks for cancels between steps, is ``diffgemma_engine.canvas.loop.run_steps``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import torch
from transformers import DynamicCache

from .sampler import Sampler, SamplerSettings, Scores, StepNoise, accept_mask, settled, stable_steps
from .start import StartCanvas, first_canvas, first_step

if TYPE_CHECKING:
    from transformers import DiffusionGemmaForBlockDiffusion

MaskMapping = Mapping[str, torch.Tensor | None]

PIN_LOGIT = -1.0e4
"""A held position's logits: this for every token but its own (0), a one-hot softmax in any float dtype."""


class DecoderInputs(Protocol):
    """The encoded prompt a canvas attends to, fixed through its steps (``PromptView``, or
    ``diffgemma_engine.canvas.static.StaticPrompt``'s buffers)."""

    @property
    def cache(self) -> DynamicCache:
        """The decoder's view of the encoder's keys and values."""
        ...

    @property
    def masks(self) -> MaskMapping:
        """Per layer type, what each canvas position sees."""
        ...

    @property
    def positions(self) -> torch.Tensor:
        """(B, C) int32: each row's canvas positions, after its own prompt."""
        ...


@dataclass
class PromptView:
    """:class:`DecoderInputs` over a ``DynamicCache`` as long as the prompt (the eager loop's)."""

    cache: DynamicCache
    masks: MaskMapping
    positions: torch.Tensor


@dataclass
class StepState:
    """The denoising loop's tensors between steps."""

    canvas: torch.Tensor  # (B, C) long: the tokens the next step denoises
    best: torch.Tensor  # (B, C) long: the last step's argmax (the answer so far)
    self_conditioning: torch.Tensor | None  # (B, C, V) embedding dtype: the last step's logits (None or zeros before)
    conditioned: torch.Tensor | None  # (B,) bool: rows whose ``self_conditioning`` holds logits (None: all do)
    history: torch.Tensor  # (S, B, C) long: the last S steps' ``best`` (S: the stability threshold; -1 unset)
    finished: torch.Tensor  # (B,) bool: rows that settled, or that a row check stopped
    remaining: torch.Tensor  # () int32: the step of the schedule the next step runs, counting down to 1
    total: torch.Tensor  # () int32: the schedule's length N (a tensor: one graph serves every step count)
    held: torch.Tensor | None = None  # (B, C) bool: positions held at ``held_tokens`` (a rewrite's kept segments)
    held_tokens: torch.Tensor | None = None  # (B, C) long; both None when nothing is held
    stable: torch.Tensor | None = None  # (B, C) float32: the steps in a row ``best`` has been the argmax

    def take_self_conditioning(self) -> torch.Tensor | None:
        """The last step's logits, for the decoder. The eager loop's state (``conditioned`` None) gives them up
        here, so that the step lets them go once the decoder has read them: one vocabulary-sized tensor fewer while
        it samples (``diffgemma_engine.loading.plan.STEP_VOCAB_TENSORS``). A fixed-shape state keeps its buffer."""
        logits = self.self_conditioning
        if self.conditioned is None:
            self.self_conditioning = None
        return logits


ScorePass = Callable[[torch.Tensor, torch.Tensor | None, torch.Tensor | None, DecoderInputs, torch.Tensor], Scores]
"""(canvas, self-conditioning logits, their (B,) mask, prompt, temperature) -> the step's scores."""


def model_forward(model: DiffusionGemmaForBlockDiffusion) -> Callable[..., torch.Tensor]:
    """The model's own decoder pass for one step: what ``DiffusionGemmaForBlockDiffusion.generate`` calls."""

    def forward(
        canvas: torch.Tensor,
        self_conditioning: torch.Tensor | None,
        conditioned: torch.Tensor | None,
        inputs: DecoderInputs,
    ) -> torch.Tensor:
        logits: torch.Tensor = model(
            decoder_input_ids=canvas,
            self_conditioning_logits=self_conditioning,
            self_conditioning_mask=conditioned,
            decoder_attention_mask=inputs.masks,
            cache=inputs.cache,
            decoder_position_ids=inputs.positions,
        ).logits
        return logits

    return forward


def eager_scores(model: DiffusionGemmaForBlockDiffusion, sampler: Sampler) -> ScorePass:
    """Step 1 run op by op: the model's forward, then ``sampler.scores``."""
    forward = model_forward(model)

    def score(
        canvas: torch.Tensor,
        self_conditioning: torch.Tensor | None,
        conditioned: torch.Tensor | None,
        inputs: DecoderInputs,
        temperature: torch.Tensor,
    ) -> Scores:
        return sampler.scores(forward(canvas, self_conditioning, conditioned, inputs), temperature)

    return score


@dataclass(frozen=True)
class StepParts:
    """What a step is run with: its scoring pass, its sampler, the schedule, and the embeddings' dtype (the
    self-conditioning logits are kept in it)."""

    score: ScorePass
    sampler: Sampler
    settings: SamplerSettings
    embed_dtype: torch.dtype


def pin_scores(scores: Scores, held: torch.Tensor, tokens: torch.Tensor) -> Scores:
    """``scores`` certain of ``tokens`` at the ``held`` positions (B, C): their logits one-hot (``PIN_LOGIT``
    elsewhere, so the next step's self-conditioning sees the token), their argmax the token, their entropy 0 (no
    weight in the bound or the stopper). Their probabilities are left: what is drawn there is replaced anyway.
    The logits are changed in place (the step's own tensor: no second vocabulary-sized copy)."""
    logits = scores.logits
    own = torch.where(held, 0.0, logits.gather(-1, tokens[..., None]).squeeze(-1)).to(logits.dtype)
    logits.masked_fill_(held[..., None], PIN_LOGIT).scatter_(-1, tokens[..., None], own[..., None])
    best = torch.where(held, tokens, scores.best)
    return Scores(logits, best, scores.probs, scores.entropy.masked_fill(held, 0.0))


def denoise_step(parts: StepParts, inputs: DecoderInputs, state: StepState, noise: StepNoise | None) -> StepState:
    """One denoising step (the numbered list in this module's docstring), a function of the state, the prompt and
    (for the exact sampler) the step's random numbers. No decision in it is the host's. The step owns ``state``:
    the caller uses the state it returns, not this one (``StepState.take_self_conditioning``)."""
    settings = parts.settings
    temperature = settings.t_min + (settings.t_max - settings.t_min) * (state.remaining / state.total)
    scores = parts.score(state.canvas, state.take_self_conditioning(), state.conditioned, inputs, temperature)  # 1
    if state.held is not None and state.held_tokens is not None:  # 2
        scores = pin_scores(scores, state.held, state.held_tokens)
    accepted = accept_mask(scores.entropy, settings.entropy_bound)  # 3
    sample, renoise = parts.sampler.draw(scores, state.canvas, accepted, noise)  # 4
    canvas = torch.where(accepted, sample, renoise)  # 5
    if state.held is not None and state.held_tokens is not None:
        canvas = torch.where(state.held, state.held_tokens, canvas)
    done = state.finished[:, None]  # 6
    best = torch.where(done, state.best, scores.best)
    canvas = torch.where(done, state.canvas, canvas)
    history = torch.cat([state.history[1:], best[None]])
    finished = state.finished | settled(state.history, best, scores.entropy, settings)  # 7
    stable = stable_steps(scores.best, state.best, state.stable)  # 8
    if state.stable is not None:
        stable = torch.where(done, state.stable, stable)
    return StepState(
        canvas=canvas,
        best=best,
        self_conditioning=scores.logits.to(parts.embed_dtype),
        conditioned=None if state.conditioned is None else torch.ones_like(state.conditioned),
        history=history,
        finished=finished,
        remaining=state.remaining - 1,
        total=state.total,
        held=state.held,
        held_tokens=state.held_tokens,
        stable=stable,
    )


Step = Callable[[DecoderInputs, StepState, StepNoise | None], StepState]
"""A way of running :func:`denoise_step` with its parts bound: eager, or compiled."""


def step_of(parts: StepParts) -> Step:
    """:func:`denoise_step` with ``parts``, run op by op."""
    return functools.partial(denoise_step, parts)


def initial_state(
    batch: int,
    canvas_length: int,
    vocab_size: int,
    settings: SamplerSettings,
    embed_dtype: torch.dtype,
    device: torch.device,
    generator: torch.Generator | None,
    start: StartCanvas | None = None,
    *,
    fixed_shapes: bool = True,
) -> StepState:
    """The state before the first step: a canvas of noise drawn with ``generator`` (or a rewrite's renoised start),
    nothing settled, at the schedule's first step.

    With ``fixed_shapes`` (a compiled graph's state) the self-conditioning logits are zeros masked off until the
    first step has run, and held positions are a tensor even when none is held; without, they are None, which the
    model and the step skip (no vocabulary-sized tensor of zeros)."""
    shape = (batch, canvas_length)
    canvas = first_canvas(shape, vocab_size, device, generator, start)
    held = held_tokens = None
    if start is not None and start.fixed is not None and (fixed_shapes or bool(start.fixed.any())):
        held, held_tokens = start.fixed.clone(), start.tokens.clone()
    self_conditioning = conditioned = None
    if fixed_shapes:
        self_conditioning = torch.zeros((*shape, vocab_size), dtype=embed_dtype, device=device)
        conditioned = torch.zeros(batch, dtype=torch.bool, device=device)
    return StepState(
        canvas=canvas,
        best=canvas,
        self_conditioning=self_conditioning,
        conditioned=conditioned,
        history=torch.full((settings.stability_threshold, *shape), -1, dtype=torch.long, device=device),
        finished=torch.zeros(batch, dtype=torch.bool, device=device),
        remaining=torch.tensor(first_step(start, settings.max_steps), dtype=torch.int32, device=device),
        total=torch.tensor(settings.max_steps, dtype=torch.int32, device=device),
        held=held,
        held_tokens=held_tokens,
        stable=torch.zeros(shape, dtype=torch.float32, device=device),
    )
