"""The denoising step on fixed shapes, with no host in it: the way a step is compiled as one graph and captured.

The eager loop (``diffgemma_engine.canvas.denoise``) asks the host inside every step: ``nonzero`` finds the accepted
positions for the fast sampler, and the decoder reads a cache as long as the prompt, so every prompt length is a
new shape. On a GPU each such call stops the host until the GPU catches up, and Python issues the step's thousands
of kernels one by one: the release's step measured 67 to 92 ms on an H200 against a bandwidth floor of about
11 ms. Here the same step (``diffgemma_engine.canvas.step.denoise_step``) runs on fixed shapes, so that it can be
captured as a CUDA graph and replayed as one launch (``torch.compile(mode="reduce-overhead")`` through
``compile_step``):

* ``StaticPrompt``: the encoded prompt's keys and values copied once per request into fixed-size buffers (full
  attention layers: the prompt's bucket, ``prompt_bucket``; sliding layers: at most ``window - 1``, what the
  decoder's sliding layers see), with the 4-D masks that hide the empty slots and each row's canvas positions. The
  decoder never writes its cache, so the buffers stay put through the canvas's steps; a batch of prompts of
  different lengths is one more mask, not a new shape.
* ``exact_step``: ``denoise_step`` with the exact sampler (``sampler.ExactSampler``), whose random numbers are
  drawn outside the step (``StepNoise.draw``, in ``torch.multinomial``'s order), so the tokens are the eager exact
  loop's for the same seed where the arithmetic agrees (``tests/engine/test_static_step.py``); ``compile_step``
  compiles it as one graph.
* ``denoise_static``: the one host loop (``diffgemma_engine.canvas.loop.run_steps``) on a ``StaticPrompt``.

Drawing a variate per vocabulary entry costs on a CPU, where the eager fast path (a draw per accepted position)
stays the engine's loop; on a GPU it is one kernel of a few hundred microseconds at the release's size.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicSlidingWindowLayer

from .caches import attention_layer, keys_values
from .loop import Denoised, StopCheck, run_steps
from .runtime import execution_device, text_config_of, under_grad_mode
from .sampler import ExactSampler, SamplerSettings, StepNoise
from .start import StartCanvas, first_step
from .step import DecoderInputs, Step, StepParts, StepState, eager_scores, initial_state, step_of

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
        """Copy each row's decoder view (``diffgemma_engine.canvas.caches.decoder_view``) into the buffers, in place
        (the addresses a captured graph reads stay the same), and set the masks and positions to match."""
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


def exact_step(model: DiffusionGemmaForBlockDiffusion, settings: SamplerSettings) -> Step:
    """``denoise_step`` for ``model`` with the exact sampler, run op by op on a ``StaticPrompt``."""
    sampler = ExactSampler()
    embed_dtype = model.model.decoder.embed_tokens.weight.dtype
    return step_of(StepParts(eager_scores(model, sampler), sampler, settings, embed_dtype))


def compile_step(model: DiffusionGemmaForBlockDiffusion, settings: SamplerSettings, mode: str = "default") -> Step:
    """``denoise_step`` compiled as one graph (``fullgraph``: a host synchronisation or a data-dependent shape in
    it fails the compile instead of splitting the graph) with static shapes; ``mode="reduce-overhead"`` also
    captures it as a CUDA graph on a GPU and replays it as one launch.

    Each (batch, canvas, prompt bucket) is its own graph, whatever the step count (``StepState.total``); the
    sampler's other settings are the graph's constants. Warm the shapes up before serving.
    """
    step = exact_step(model, settings)
    compiled = torch.compile(step, fullgraph=True, dynamic=False, mode=mode)
    captures = mode in ("reduce-overhead", "max-autotune")

    def run(prompt: DecoderInputs, state: StepState, noise: StepNoise | None) -> StepState:
        if captures:  # a new step: the graph may overwrite the previous replay's outputs (read before this call)
            torch.compiler.cudagraph_mark_step_begin()  # type: ignore[no-untyped-call]
        out: StepState = compiled(prompt, state, noise)
        return out

    return run


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
    """Denoise one canvas per row of ``prompt`` (loaded), as ``diffgemma_engine.canvas.denoise.denoise_canvas`` does
    with ``settings.exact``: the same random stream, the same stopping rule, the same answer, with every step a
    ``denoise_step`` (``step``: eager by default, or ``compile_step``'s graph).

    The host reads the (B,) finished flags after each step, to stop and to count each row's steps: between steps,
    where a cancel is answered too, never inside one.
    """
    device = execution_device(model)
    vocab_size = text_config_of(model.config).vocab_size
    embed_dtype = model.model.decoder.embed_tokens.weight.dtype
    batch, canvas_length = prompt.batch, prompt.canvas_length
    step = step or exact_step(model, settings)
    state = initial_state(batch, canvas_length, vocab_size, settings, embed_dtype, device, generator, start)
    noise = functools.partial(StepNoise.draw, batch, canvas_length, vocab_size, device, generator)
    steps = first_step(start, settings.max_steps)
    return run_steps(step, prompt, state, steps, noise, should_stop, on_step, row_checks)
