"""A denoising step with no host in the loop: fixed shapes, no synchronisation, the sampler inside.

The eager loop (``engine.canvas.denoise``) asks the host inside every step: ``nonzero`` finds the accepted
positions, ``torch.multinomial`` and ``Categorical`` check their arguments with ``.item()``, and the decoder reads
a cache as long as the prompt, so every prompt length is a new shape. On a GPU each such call stops the host until
the GPU catches up, and Python issues the step's thousands of kernels one by one: the release's step measured 67
to 92 ms on an H200 against a bandwidth floor of about 11 ms. This module is the same step written so that it
can be captured as a CUDA graph and replayed as one launch (``torch.compile(mode="reduce-overhead")`` through
``compile_step``):

* ``StaticPrompt``: the encoded prompt's keys and values copied once per request into fixed-size buffers (full
  attention layers: the prompt's bucket, ``prompt_bucket``; sliding layers: at most ``window - 1``, what the
  decoder's sliding layers see), with the 4-D masks that hide the empty slots and each row's canvas positions. The
  decoder never writes its cache, so the buffers stay put through the canvas's steps; a batch of prompts of
  different lengths is one more mask, not a new shape.
* ``StepState``: the loop's tensors (canvas, best, self-conditioning logits, stability history, finished rows,
  the step counter), all of fixed shape on the model's device.
* ``denoise_step``: one step as a pure function of the state, the prompt and the step's random numbers: the
  decoder pass, the temperature, held positions, the sampler's scores, the entropy bound, renoising, frozen rows
  and the stopping rule, every decision a ``torch.where``.
* ``denoise_static``: the host loop around it. Between steps, never inside one, it asks ``should_stop`` and the
  row checks and reads the (B,) finished flags.

The sampler is the eager loop's ``exact`` one. ``torch.multinomial`` with one sample checks ``p`` with an
``.item()``, then draws an exponential variate per entry and takes ``argmax(p / q)``; the loop here draws the same
variates from the request's generator, in the same order (``StepNoise.draw``), outside the graph, and the step
takes the same argmax, so the tokens are the eager exact loop's for the same seed where the arithmetic agrees
(``tests/engine/test_static_step.py``). The entropy is ``Categorical``'s arithmetic without its argument check.
Drawing a variate per vocabulary entry costs on a CPU, where the eager fast path (a draw per accepted position)
stays the engine's loop; on a GPU it is one kernel of a few hundred microseconds at the release's size.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicSlidingWindowLayer

from ..checkpoint_files import text_config_of
from ..placement import execution_device
from ..quantize import under_grad_mode
from .caches import attention_layer, keys_values
from .denoise import PIN_LOGIT, Denoised, StartCanvas, StopCheck, renoise_start, start_step
from .sampler import SamplerSettings, accept_mask

if TYPE_CHECKING:
    from transformers import DiffusionGemmaForBlockDiffusion

SMALLEST_BUCKET = 256


def prompt_bucket(length: int, smallest: int = SMALLEST_BUCKET) -> int:
    """The prompt capacity a prompt of ``length`` tokens is served in: the next power of two, at least
    ``smallest`` (a few fixed shapes, so that a few graphs serve every prompt)."""
    return max(smallest, 1 << max(length - 1, 0).bit_length())


@dataclass
class StaticPrompt:
    """Fixed-size copies of encoded prompts for the decoder: buffers, masks and canvas positions.

    ``cache`` is a ``DynamicCache`` whose layers hold (B, heads, slots, head_dim) buffers: ``capacity`` slots in
    full-attention layers, ``min(capacity, window - 1)`` in sliding ones. ``masks`` maps each layer type to the
    (B, 1, C, slots + C) boolean mask of what a canvas query sees (a row's filled slots, then the whole canvas);
    ``positions`` (B, C) are each row's canvas positions, after its own prompt.
    """

    cache: DynamicCache
    masks: dict[str, torch.Tensor]
    positions: torch.Tensor
    capacity: int
    canvas_length: int

    @classmethod
    def allocate(
        cls, model: DiffusionGemmaForBlockDiffusion, like: DynamicCache, batch: int, capacity: int, canvas_length: int
    ) -> StaticPrompt:
        """Zeroed buffers shaped like the decoder view ``like`` (heads, head size and dtype of each layer)."""
        device = execution_device(model)
        cache = DynamicCache(config=model.config.get_text_config(decoder=True))
        slots_of: dict[str, int] = {}
        for source, target in zip(like.layers, cache.layers, strict=True):
            keys, values = keys_values(source)
            layer = attention_layer(target)
            if isinstance(layer, DynamicSlidingWindowLayer):
                slots = slots_of["sliding_attention"] = min(capacity, layer.sliding_window - 1)
            else:
                slots = slots_of["full_attention"] = capacity
            key_buffer = keys.new_zeros((batch, keys.shape[1], slots, keys.shape[3]))
            value_buffer = values.new_zeros((batch, values.shape[1], slots, values.shape[3]))
            layer.lazy_initialization(key_buffer, value_buffer)
            layer.keys, layer.values = key_buffer, value_buffer
        masks = {
            kind: torch.zeros((batch, 1, canvas_length, slots + canvas_length), dtype=torch.bool, device=device)
            for kind, slots in slots_of.items()
        }
        positions = torch.zeros((batch, canvas_length), dtype=torch.int32, device=device)
        for filled in cache.layers:  # a captured graph reads these in place instead of copying them each replay
            for tensor in keys_values(filled):
                torch._dynamo.mark_static_address(tensor)
        for tensor in (*masks.values(), positions):
            torch._dynamo.mark_static_address(tensor)
        return cls(cache, masks, positions, capacity, canvas_length)

    @property
    def batch(self) -> int:
        return self.positions.shape[0]

    def load(self, views: Sequence[DynamicCache]) -> None:
        """Copy each row's decoder view (``engine.canvas.caches.decoder_view``) into the buffers, in place (the
        addresses a captured graph reads stay the same), and set the masks and positions to match."""
        if len(views) != self.batch:
            raise ValueError(f"{len(views)} prompts for a batch of {self.batch}")
        lengths = [view.get_seq_length() for view in views]
        if max(lengths) > self.capacity:
            raise ValueError(f"a prompt of {max(lengths)} tokens does not fit a capacity of {self.capacity}")
        canvas = self.canvas_length
        for row, view in enumerate(views):
            for source, target in zip(view.layers, self.cache.layers, strict=True):
                keys, values = keys_values(source)
                key_buffer, value_buffer = keys_values(target)
                held = keys.shape[2]  # a sliding layer holds at most window - 1 of the prompt's tokens
                key_buffer[row, :, :held].copy_(keys[0])
                value_buffer[row, :, :held].copy_(values[0])
            for mask in self.masks.values():
                slots = mask.shape[-1] - canvas
                mask[row].fill_(False)
                mask[row, :, :, : min(lengths[row], slots)] = True
                mask[row, :, :, slots:] = True
            self.positions[row].copy_(torch.arange(lengths[row], lengths[row] + canvas, dtype=torch.int32))


@dataclass
class StepState:
    """The denoising loop's tensors between steps, each of a fixed shape."""

    canvas: torch.Tensor  # (B, C) long: the tokens the next step denoises
    best: torch.Tensor  # (B, C) long: the last step's argmax (the answer so far)
    self_conditioning: torch.Tensor  # (B, C, V) embedding dtype: the last step's logits (zeros before the first)
    conditioned: torch.Tensor  # (B,) bool: whether ``self_conditioning`` holds a step's logits
    history: torch.Tensor  # (S, B, C) long: the last S steps' ``best`` (S: the stability threshold; -1 unset)
    finished: torch.Tensor  # (B,) bool: rows that settled, or that a row check stopped
    remaining: torch.Tensor  # () int32: the step of the schedule the next step runs, counting down to 1
    total: torch.Tensor  # () int32: the schedule's length N (a tensor: one graph serves every step count)
    held: torch.Tensor | None = None  # (B, C) bool: positions held at ``held_tokens`` (a rewrite's kept segments)
    held_tokens: torch.Tensor | None = None  # (B, C) long; both None when nothing is held (its own graph)


@dataclass
class StepNoise:
    """One step's random numbers, drawn outside the graph with the request's generator."""

    exponential: torch.Tensor  # (B * C, V) float32: the variates ``torch.multinomial`` would draw
    renoise: torch.Tensor  # (B, C) long: the random tokens for positions not accepted

    @classmethod
    def draw(
        cls, batch: int, canvas_length: int, vocab_size: int, device: torch.device, generator: torch.Generator | None
    ) -> StepNoise:
        """What the eager exact step draws, in its order: the multinomial's variates, then the renoising tokens."""
        exponential = torch.empty((batch * canvas_length, vocab_size), dtype=torch.float32, device=device)
        exponential.exponential_(1, generator=generator)
        renoise = torch.randint(0, vocab_size, (batch, canvas_length), device=device, generator=generator)
        return cls(exponential, renoise)


def categorical_entropy(logits: torch.Tensor) -> torch.Tensor:
    """``torch.distributions.Categorical(logits=logits).entropy()``, the same arithmetic, without the argument
    check (an ``.all()`` read by the host)."""
    normalized = logits - logits.logsumexp(dim=-1, keepdim=True)
    probs = torch.softmax(normalized, dim=-1)
    clamped = torch.clamp(normalized, min=torch.finfo(normalized.dtype).min)
    return -(clamped * probs).sum(-1)


Forward = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, StaticPrompt], torch.Tensor]
"""(canvas, self-conditioning logits, their (B,) mask, prompt) -> logits (B, C, V)."""


def model_forward(model: DiffusionGemmaForBlockDiffusion) -> Forward:
    """The model's own decoder pass against a ``StaticPrompt`` (its buffers as the cache, its masks as a dict)."""

    def forward(
        canvas: torch.Tensor, self_conditioning: torch.Tensor, conditioned: torch.Tensor, prompt: StaticPrompt
    ) -> torch.Tensor:
        logits: torch.Tensor = model(
            decoder_input_ids=canvas,
            self_conditioning_logits=self_conditioning,
            self_conditioning_mask=conditioned,
            decoder_attention_mask=prompt.masks,
            cache=prompt.cache,
            decoder_position_ids=prompt.positions,
        ).logits
        return logits

    return forward


def denoise_step(
    forward: Forward,
    prompt: StaticPrompt,
    state: StepState,
    noise: StepNoise,
    settings: SamplerSettings,
    embed_dtype: torch.dtype,
) -> StepState:
    """One denoising step (``engine.canvas.denoise``'s loop body, exact sampler), with no host decision in it."""
    logits = forward(state.canvas, state.self_conditioning, state.conditioned, prompt)
    temperature = settings.t_min + (settings.t_max - settings.t_min) * (state.remaining / state.total)
    logits = logits / temperature
    if state.held is not None and state.held_tokens is not None:  # a held position is certain of its token
        pinned = torch.full_like(logits, PIN_LOGIT).scatter_(-1, state.held_tokens[..., None], 0.0)
        logits = torch.where(state.held[..., None], pinned, logits)  # (``pin_logits``)
    shape = state.canvas.shape
    new_best = torch.argmax(logits, dim=-1)
    probs = torch.softmax(logits, dim=-1, dtype=torch.float32)
    sample = (probs.view(-1, probs.shape[-1]) / noise.exponential).argmax(dim=-1).view(shape)
    entropy = categorical_entropy(logits)
    accepted = accept_mask(entropy, settings.entropy_bound)
    new_canvas = torch.where(accepted, sample, noise.renoise)
    if state.held is not None and state.held_tokens is not None:
        new_canvas = torch.where(state.held, state.held_tokens, new_canvas)
    done = state.finished[:, None]  # rows that are done keep their canvas, answer and logits
    new_best = torch.where(done, state.best, new_best)
    new_canvas = torch.where(done, state.canvas, new_canvas)
    logits = torch.where((state.finished & state.conditioned)[:, None, None], state.self_conditioning, logits)
    if settings.stability_threshold == 0:
        stable = torch.ones_like(state.finished)
    else:
        stable = (state.history == new_best[None]).all(dim=-1).all(dim=0)
    history = torch.cat([state.history[1:], new_best[None]])
    finished = state.finished | (stable & (entropy.mean(dim=-1) < settings.confidence_threshold))
    return StepState(
        canvas=new_canvas,
        best=new_best,
        self_conditioning=logits.to(embed_dtype),
        conditioned=torch.ones_like(state.conditioned),
        history=history,
        finished=finished,
        remaining=state.remaining - 1,
        total=state.total,
        held=state.held,
        held_tokens=state.held_tokens,
    )


Step = Callable[[StaticPrompt, StepState, StepNoise], StepState]


def eager_step(model: DiffusionGemmaForBlockDiffusion, settings: SamplerSettings) -> Step:
    """``denoise_step`` for ``model``, run op by op."""
    forward = model_forward(model)
    embed_dtype = model.model.decoder.embed_tokens.weight.dtype

    def step(prompt: StaticPrompt, state: StepState, noise: StepNoise) -> StepState:
        return denoise_step(forward, prompt, state, noise, settings, embed_dtype)

    return step


def compile_step(model: DiffusionGemmaForBlockDiffusion, settings: SamplerSettings, mode: str = "default") -> Step:
    """``denoise_step`` compiled as one graph (``fullgraph``: a host synchronisation or a data-dependent shape in
    it fails the compile instead of splitting the graph) with static shapes; ``mode="reduce-overhead"`` also
    captures it as a CUDA graph on a GPU and replays it as one launch.

    Each (batch, canvas, prompt bucket) is its own graph, whatever the step count (``StepState.total``); the
    sampler's other settings are the graph's constants. Warm the shapes up before serving.
    """
    step = eager_step(model, settings)
    compiled = torch.compile(step, fullgraph=True, dynamic=False, mode=mode)
    captures = mode in ("reduce-overhead", "max-autotune")

    def run(prompt: StaticPrompt, state: StepState, noise: StepNoise) -> StepState:
        if captures:  # a new step: the graph may overwrite the previous replay's outputs (read before this call)
            torch.compiler.cudagraph_mark_step_begin()  # type: ignore[no-untyped-call]
        out: StepState = compiled(prompt, state, noise)
        return out

    return run


def initial_state(
    batch: int,
    canvas_length: int,
    vocab_size: int,
    settings: SamplerSettings,
    embed_dtype: torch.dtype,
    device: torch.device,
    generator: torch.Generator | None,
    start: StartCanvas | None = None,
) -> StepState:
    """The state before the first step: a canvas of noise drawn with ``generator`` (or a rewrite's renoised
    start), nothing settled, at the schedule's first step."""
    shape = (batch, canvas_length)
    held = held_tokens = None
    if start is None:
        canvas = torch.randint(0, vocab_size, shape, device=device, generator=generator)
        first = settings.max_steps
    else:
        canvas = renoise_start(start, vocab_size, generator)
        first = start_step(start.strength, settings.max_steps)
        if start.fixed is not None:
            held, held_tokens = start.fixed.clone(), start.tokens.clone()
    return StepState(
        canvas=canvas,
        best=canvas,
        self_conditioning=torch.zeros((*shape, vocab_size), dtype=embed_dtype, device=device),
        conditioned=torch.zeros(batch, dtype=torch.bool, device=device),
        history=torch.full((settings.stability_threshold, *shape), -1, dtype=torch.long, device=device),
        finished=torch.zeros(batch, dtype=torch.bool, device=device),
        remaining=torch.tensor(first, dtype=torch.int32, device=device),
        total=torch.tensor(settings.max_steps, dtype=torch.int32, device=device),
        held=held,
        held_tokens=held_tokens,
    )


@under_grad_mode
def denoise_static(
    model: DiffusionGemmaForBlockDiffusion,
    prompt: StaticPrompt,
    settings: SamplerSettings,
    generator: torch.Generator | None = None,
    should_stop: StopCheck | None = None,
    on_step: Callable[[int], None] | None = None,
    *,
    row_checks: Sequence[StopCheck] | None = None,
    step: Step | None = None,
    start: StartCanvas | None = None,
) -> Denoised:
    """Denoise one canvas per row of ``prompt`` (loaded), as ``engine.canvas.denoise.denoise_canvas`` does with
    ``settings.exact``: the same random stream, the same stopping rule, the same answer, with every step a
    ``denoise_step`` (``step``: eager by default, or ``compile_step``'s graph).

    The host reads the (B,) finished flags after each step, to stop and to count each row's steps: between steps,
    where a cancel is answered too, never inside one.
    """
    device = execution_device(model)
    vocab_size = text_config_of(model.config).vocab_size
    embed_dtype = model.model.decoder.embed_tokens.weight.dtype
    batch, canvas_length = prompt.batch, prompt.canvas_length
    step = step or eager_step(model, settings)
    state = initial_state(batch, canvas_length, vocab_size, settings, embed_dtype, device, generator, start)
    first_step = settings.max_steps if start is None else start_step(start.strength, settings.max_steps)
    finished = [False] * batch
    row_stops: list[str | None] = [None] * batch
    row_steps = [0] * batch
    steps = 0
    for _ in range(first_step, 0, -1):
        if should_stop is not None and (reason := should_stop()) is not None:
            return Denoised(state.best.clone(), steps, reason, state.finished.clone(), row_steps, [reason] * batch)
        stopped = False
        for row, check in enumerate(row_checks or ()):
            if not finished[row] and (reason := check()) is not None:
                finished[row], row_stops[row], stopped = True, reason, True
        if stopped:
            state.finished = torch.tensor(finished, dtype=torch.bool, device=device)
        if all(finished):
            break
        steps += 1
        for row in range(batch):
            row_steps[row] += not finished[row]
        noise = StepNoise.draw(batch, canvas_length, vocab_size, device, generator)
        state = step(prompt, state, noise)
        finished = state.finished.tolist()  # the one read of a step's result, after it
        if on_step is not None:
            on_step(steps)
        if all(finished):
            break
    # copies: a captured graph's outputs are overwritten by its next replay (the next request's first step)
    return Denoised(state.best.clone(), steps, None, state.finished.clone(), row_steps, row_stops)
