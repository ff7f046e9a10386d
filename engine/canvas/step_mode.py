"""How the engine runs the one denoising step: ``diffgemma-engine serve --step eager|compiled|captured``.

Every mode runs ``step.denoise_step``; they differ in what is compiled around it. Standard library only, so the
engine's command line reads it without torch.
"""

from __future__ import annotations

import enum


class StepMode(enum.Enum):
    """The way to get the denoising step, chosen once per engine; ``LoadedModel.step_state`` reports it."""

    AUTO = "auto"
    """The default: ``CAPTURED`` on a CUDA device (CUDA graphs take the host out of the step, and the eager loop
    serves until they are captured, or for good when they cannot be), ``EAGER`` elsewhere (on a CPU the captured
    step gains little, and MPS has no graphs)."""
    EAGER = "eager"
    """Op by op (``denoise.denoise_canvas``): the exact or the fast sampler, every shape."""
    COMPILED = "compiled"
    """The decoder pass and scores under ``torch.compile`` with dynamic shapes (``compiled.DecoderStep``), compiled
    in the background: served eagerly until then."""
    CAPTURED = "captured"
    """The whole step compiled as one graph per serving shape on fixed buffers (``captured.CapturedLoop``; a CUDA
    graph on a GPU), warmed in the background; the eager loop serves until then, and serves batches, candidates
    and rewrites with held text."""

    def on(self, device_type: str) -> StepMode:
        """The mode that runs on a model whose inputs are on ``device_type`` (``AUTO`` decided; the others as they
        are)."""
        if self is not StepMode.AUTO:
            return self
        return StepMode.CAPTURED if device_type == "cuda" else StepMode.EAGER


STEP_MODES: tuple[str, ...] = tuple(mode.value for mode in StepMode)
