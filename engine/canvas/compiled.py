"""The denoising step's dense work compiled: the decoder's forward pass, then the fast sampler's scores (step 1 of
``diffgemma_engine.canvas.step.denoise_step``), as :class:`DecoderStep`, a scoring pass the step is run with.

On these small models a step is bound by its many small operations, not by arithmetic: eager PyTorch runs
thousands of operator calls a step, and on one thread the vocabulary-sized element-wise work (soft-capping,
temperature, softmax, entropy) is a large share of it. ``torch.compile`` fuses that work into a few vectorised
kernels and drops most of the per-operation cost.

This module is the mechanism only; the caller decides to compile and hands in the warm-up (gpt-fast's shape:
``diffgemma_engine.runtimes.own_loop`` passes ``diffgemma_engine.canvas.warmup.trace_serving_shapes``). Compiling is
slow, most of it dynamo tracing transformers' Python, which holds the GIL: the engine does not wait for it
(:class:`DecoderStep` runs eagerly until a background thread has compiled and warmed up the graphs, then switches), but
completions served meanwhile are slow. It pays in an engine that runs for long. The graphs are built with dynamic
shapes, so prompt and canvas lengths do not recompile; a call that would need a graph the warm-up did not build runs
eagerly instead of compiling on the model thread. A compile that fails (no C++ compiler, an unsupported operator) leaves
the engine eager, with the reason in ``state`` and the log.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
from transformers import DynamicCache

from .sampler import Scores, score_logits
from .step import DecoderInputs, MaskMapping, PromptView, ScorePass, model_forward

if TYPE_CHECKING:
    from transformers import DiffusionGemmaForBlockDiffusion

logger = logging.getLogger(__name__)

Forward = Callable[[torch.Tensor, torch.Tensor | None, MaskMapping, DynamicCache, torch.Tensor], torch.Tensor]
"""(canvas, self-conditioning logits or None, decoder mask mapping, encoder cache, positions) -> logits."""


def eager_forward(model: DiffusionGemmaForBlockDiffusion) -> Forward:
    """``diffgemma_engine.canvas.step.model_forward`` with the prompt's parts as arguments (graphs are traced on
    them)."""
    run = model_forward(model)

    def forward(
        canvas: torch.Tensor,
        self_conditioning: torch.Tensor | None,
        mask: MaskMapping,
        cache: DynamicCache,
        position_ids: torch.Tensor,
    ) -> torch.Tensor:
        return run(canvas, self_conditioning, None, PromptView(cache, mask, position_ids))

    return forward


class DecoderStep:
    """``step(canvas, self_conditioning, mask, cache, positions, temperature) -> Scores``.

    Eager until ``start_compiling`` has compiled and warmed up the graphs, then compiled. ``state`` is ``eager``
    (not compiling), ``compiling``, ``compiled``, or ``failed: <reason>``. Only steps with self-conditioning
    logits (all but the first of a canvas) use the compiled graphs.
    """

    def __init__(
        self,
        model: DiffusionGemmaForBlockDiffusion,
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

    def score_pass(self) -> ScorePass:
        """This step as ``denoise_step``'s scoring pass (every row conditioned after the first step)."""

        def score(
            canvas: torch.Tensor,
            self_conditioning: torch.Tensor | None,
            conditioned: torch.Tensor | None,
            inputs: DecoderInputs,
            temperature: torch.Tensor,
        ) -> Scores:
            return self(canvas, self_conditioning, inputs.masks, inputs.cache, inputs.positions, temperature)

        return score

    def without_fallback(self) -> DecoderStep:
        """The same compiled graphs, raising where serving would fall back to eager (a test of their coverage)."""
        if self._compiled is None:
            raise RuntimeError(f"nothing compiled ({self.state})")
        return DecoderStep(self.model, self._compiled, stance="fail_on_recompile")

    def start_compiling(self, warm_up: Callable[[DecoderStep], None]) -> None:
        """Compile, then run ``warm_up`` on a step over the compiled graphs (it traces the shapes to serve), in a
        background thread; the eager forward serves until then."""
        if self._thread is not None:
            return
        self.state = "compiling"
        self._thread = threading.Thread(target=self._compile, args=(warm_up,), name="diffgemma-compile", daemon=True)
        self._thread.start()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until compiling has ended (compiled or failed); False on timeout or when never started."""
        return self._thread is not None and self._ready.wait(timeout)

    def _compile(self, warm_up: Callable[[DecoderStep], None]) -> None:
        started = time.perf_counter()
        try:
            compiled = torch.compile(self.eager, dynamic=True)
            warm_up(DecoderStep(self.model, compiled, stance="default"))  # tracing: each new shape compiles
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
