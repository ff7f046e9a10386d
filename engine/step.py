"""One denoising step's dense work: the decoder's forward pass and the scores the sampler reads from its logits.

On these small models a step is bound by its many small operations, not by arithmetic: eager PyTorch runs some
2,800 operator calls a step, and on one thread the vocabulary-sized element-wise work (soft-capping, temperature,
softmax, entropy over 32 x 8,192 logits) takes about a quarter of it. ``torch.compile`` fuses that work into a
few vectorised kernels and drops most of the per-operation cost.

Compiling is opt-in (``diffgemma-engine serve --compile on``). It takes 30 to 60 s on 2 CPU cores, most of it
dynamo tracing transformers' Python, which holds the GIL: the engine does not wait for it (:class:`DecoderStep`
runs eagerly until a background thread has compiled and warmed up the graphs, then switches), but completions
served meanwhile are slow (a median of 2 to 3 s instead of 0.2 here). It pays in an engine that runs for long.
The graphs are built with dynamic shapes, so prompt and canvas lengths do not recompile;
a call that would need a graph the warm-up did not build runs eagerly instead of compiling on the model thread.
A compile that fails (no C++ compiler, an unsupported operator) leaves the engine eager, with the reason in
``state`` and the log.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import NamedTuple

import torch
from transformers import DynamicCache

from engine.placement import execution_device
from engine.quantize import grad_mode

logger = logging.getLogger(__name__)

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


MaskMapping = dict[str, torch.Tensor | None]
Forward = Callable[[torch.Tensor, torch.Tensor | None, MaskMapping, DynamicCache, torch.Tensor], torch.Tensor]
"""(canvas, self-conditioning logits or None, decoder mask mapping, encoder cache, positions) -> logits."""


class Scores(NamedTuple):
    """What the sampler needs from one step's logits, each computed once."""

    logits: torch.Tensor  # (B, C, V) divided by the step's temperature; the next step's self-conditioning
    best: torch.Tensor  # (B, C) argmax
    probs: torch.Tensor  # (B, C, V) float32 softmax
    entropy: torch.Tensor  # (B, C)


def eager_forward(model: torch.nn.Module) -> Forward:
    """The model's own forward for one denoising step: what ``DiffusionGemmaForBlockDiffusion.generate`` calls."""

    def forward(
        canvas: torch.Tensor,
        self_conditioning: torch.Tensor | None,
        mask: MaskMapping,
        cache: DynamicCache,
        position_ids: torch.Tensor,
    ) -> torch.Tensor:
        return model(
            decoder_input_ids=canvas,
            self_conditioning_logits=self_conditioning,
            decoder_attention_mask=mask,
            cache=cache,
            decoder_position_ids=position_ids,
        ).logits

    return forward


def score_logits(logits: torch.Tensor, temperature: torch.Tensor | float = 1.0) -> Scores:
    """Temperature, argmax, probabilities and entropy of (B, C, V) logits.

    The entropy is ``logsumexp(x) - sum(p * x)`` (the same as ``-sum(p * log p)``), so no vocabulary-sized
    log-probabilities are made: each such float32 tensor is 256 MiB per row for the release (canvas 256 x 262,144).
    The model's logits are soft-capped, hence finite.
    """
    logits = logits / temperature
    as_float = logits.float()
    probs = torch.softmax(as_float, dim=-1)
    entropy = torch.logsumexp(as_float, dim=-1) - torch.linalg.vecdot(probs, as_float)
    return Scores(logits, logits.argmax(dim=-1), probs, entropy)


class DecoderStep:
    """``step(canvas, self_conditioning, mask, cache, positions, temperature) -> Scores``.

    Eager until ``start_compiling`` has compiled and warmed up the graphs, then compiled. ``state`` is ``eager``
    (not compiling), ``compiling``, ``compiled``, or ``failed: <reason>``. Only steps with self-conditioning
    logits (all but the first of a canvas) use the compiled graphs.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        compiled: Callable[..., Scores] | None = None,
        stance: str = "eager_on_recompile",
    ) -> None:
        self.model = model
        self.state = "eager" if compiled is None else "compiled"
        self.compile_s = 0.0
        self.forward = eager_forward(model)
        self._compiled = compiled
        self._stance = stance
        """A shape the warm-up did not cover runs eagerly: compiling it on the model thread would stall it."""
        self._ready = threading.Event()
        self._thread: threading.Thread | None = None

    def __call__(
        self,
        canvas: torch.Tensor,
        self_conditioning: torch.Tensor | None,
        mask: MaskMapping,
        cache: DynamicCache,
        position_ids: torch.Tensor,
        temperature: torch.Tensor,
    ) -> Scores:
        compiled = self._compiled
        if compiled is None or self_conditioning is None:
            return self.eager(canvas, self_conditioning, mask, cache, position_ids, temperature)
        with torch.compiler.set_stance(self._stance):
            return compiled(canvas, self_conditioning, mask, cache, position_ids, temperature)

    def eager(
        self,
        canvas: torch.Tensor,
        self_conditioning: torch.Tensor | None,
        mask: MaskMapping,
        cache: DynamicCache,
        position_ids: torch.Tensor,
        temperature: torch.Tensor,
    ) -> Scores:
        """The step without compiling: the model's forward, then :func:`score_logits`."""
        return score_logits(self.forward(canvas, self_conditioning, mask, cache, position_ids), temperature)

    def without_fallback(self) -> DecoderStep:
        """The same compiled graphs, raising where serving would fall back to eager (a test of their coverage)."""
        if self._compiled is None:
            raise RuntimeError(f"nothing compiled ({self.state})")
        return DecoderStep(self.model, self._compiled, stance="fail_on_recompile")

    def start_compiling(self) -> None:
        """Compile and warm up in a background thread; the eager forward serves until then."""
        if self._thread is not None:
            return
        self.state = "compiling"
        self._thread = threading.Thread(target=self._compile, name="diffgemma-compile", daemon=True)
        self._thread.start()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until compiling has ended (compiled or failed); False on timeout or when never started."""
        return self._thread is not None and self._ready.wait(timeout)

    def _compile(self) -> None:
        started = time.perf_counter()
        try:
            compiled = torch.compile(self.eager, dynamic=True)
            self._warm_up(compiled)
        except Exception as exc:  # noqa: BLE001 - any compile failure leaves the engine eager, and says why
            reason = str(exc).splitlines()[0] if str(exc) else ""
            self.state = f"failed: {type(exc).__name__}: {reason}"
            logger.warning("torch.compile of the decoder failed; serving eagerly (%s)", self.state)
        else:
            self._compiled = compiled
            self.state = "compiled"
            logger.info("decoder compiled in %.1f s; steps now run the compiled graph", time.perf_counter() - started)
        finally:
            self.compile_s = round(time.perf_counter() - started, 1)
            self._ready.set()

    def _warm_up(self, compiled: Callable[..., Scores]) -> None:
        """Run the engine's own loop on the compiled step, on the requests of ``warm_up_prompts``.

        The caches are built as serving builds them (views of a ``PrefixCache``, stacked by ``engine.batch`` for
        the batch), so the graphs traced here are the ones serving looks up.
        """
        # Imported here: engine.batch and engine.prefix_cache import engine.denoise, which imports this module.
        from engine.batch import stack_rows  # noqa: PLC0415
        from engine.denoise import SamplerSettings, denoise_canvas  # noqa: PLC0415
        from engine.prefix_cache import PrefixCache  # noqa: PLC0415

        tracing = DecoderStep(self.model, compiled, stance="default")
        model, config = self.model, self.model.config
        device, canvas_length, vocab = execution_device(model), WARM_UP_CANVAS, config.text_config.vocab_size
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
                step=tracing,
                position_ids=positions,
                decoder_mask=decoder_mask,
            )
