"""What the socket side knows of the loaded model: plain values, no torch.

``diffgemma_engine.service.server`` answers handshakes and stats from a :class:`ModelInfo`, which the model thread
builds from its ``diffgemma_engine.loading.model.LoadedModel`` once loading is done (``LoadedModel.info``), so the
asyncio side never imports torch.
"""

from __future__ import annotations

from collections.abc import Callable

import attrs

from ..shared import protocol


@attrs.frozen(kw_only=True)
class ModelInfo:
    """The loaded model as the handshake, ``ready`` and ``stats`` report it."""

    model_id: str
    """The checkpoint folder, or "default" for the shipped model."""
    device: str
    """Where inputs and caches go (the first accelerator of a spread model)."""
    load_ms: float
    """How long loading took."""
    canvas_length: int
    """The model's own canvas."""
    max_prompt_tokens: int
    """The longest prompt the engine lays out."""
    layout: protocol.Layout
    """How the model is prompted (FIM sentinels, or its chat template)."""
    max_steps: int = 0
    """The schedule's steps at the model's own canvas."""
    min_steps: int = 0
    """The fewest of them a deadline leaves a completion."""
    seeds_reproduce: bool = True
    """Whether a request's seed reproduces its answer (not through vLLM, which takes no seed for a diffusion
    model)."""
    compile_state: Callable[[], str]
    """The denoising step's state now: eager, compiling, compiled or failed (it changes while the engine runs)."""
