"""What changes while a loaded model serves: the prompts it keeps, its step-time estimates, and the way it runs the
step (eager, then compiled once warm; or captured per serving shape).

The loader does not build it (``diffgemma_engine.loading.model.load_model`` returns the checkpoint's facts and the
model): a model's serving state is made the first time something serves with it (``LoadedModel.serving``), so that
a checkpoint whose weights another runtime holds (``load_facts``, for vLLM) never has one."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..canvas.caches import PrefixCache
from ..canvas.captured import CapturedLoop
from ..canvas.clock import StepClock
from ..canvas.compiled import DecoderStep

if TYPE_CHECKING:
    from transformers import DiffusionGemmaForBlockDiffusion


@dataclass
class ServingState:
    """The serving state of one model."""

    step: DecoderStep
    """The denoising step the engine runs: eager, then compiled once ``step.start_compiling(warm_up)`` has warmed
    up."""
    prefix_cache: PrefixCache | None = None
    """Encoded prompts kept per document, reused by the next keystroke."""
    clock: StepClock = field(default_factory=StepClock)
    """Step times measured so far, from which a deadline becomes a step budget."""
    loop: CapturedLoop | None = None
    """With ``serve --step captured``: the step captured as a graph per serving shape, for the canvases it serves."""

    @classmethod
    def of(cls, model: DiffusionGemmaForBlockDiffusion, cache_slots: int, clock: StepClock) -> ServingState:
        """A fresh state for ``model``: its step eager, a prefix cache of ``cache_slots`` prompts (0: none)."""
        cache = PrefixCache(model, slots=cache_slots) if cache_slots else None
        return cls(step=DecoderStep(model), prefix_cache=cache, clock=clock)

    def step_state(self) -> str:
        """The one state of the way the step runs: the compiled step's (eager, compiling, compiled, failed), or with
        a captured loop ``loop`` and its (warming, captured, failed), spelled as ``protocol.StepReport`` reads it."""
        return self.step.state if self.loop is None else f"loop {self.loop.state}"
