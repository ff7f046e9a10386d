"""The capturable step as the engine serves it (``diffgemma-engine serve --step captured``): one graph per serving
shape, compiled and warmed up in the background, on the buffers serving then fills.

The shapes are known when the model loads: one row, the model's canvas and its line canvas, and the prompt
buckets (``static.prompt_bucket``) up to the engine's prompt budget. A background thread compiles the step
(``static.compile_step``; ``mode="reduce-overhead"`` records a CUDA graph on a GPU) and denoises one canvas of
each shape on the very ``StaticPrompt`` buffers serving will load (a CUDA graph reads its inputs at the addresses
it was recorded with). Until then, and for any shape it did not warm (a batch, several candidates, a rewrite's
held positions, a schedule with other constants), the engine's eager loop serves: nothing waits for a compile.
A compile that fails leaves the eager loop serving, with the reason in ``state`` and the log.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import torch
from transformers import DynamicCache

from .caches import encode_prompt
from .loop import Denoised, StopCheck
from .runtime import execution_device, grad_mode, text_config_of
from .sampler import SamplerSettings
from .start import StartCanvas
from .static import StaticPrompt, compile_step, denoise_static, prompt_bucket
from .step import Step

if TYPE_CHECKING:
    from transformers import DiffusionGemmaForBlockDiffusion

logger = logging.getLogger(__name__)

Shape = tuple[int, int, int]
"""(rows, canvas length, prompt bucket): one graph each."""


def serving_shapes(canvas_lengths: Sequence[int], max_prompt_tokens: int) -> list[Shape]:
    """One row, each canvas, each prompt bucket up to the prompt budget's."""
    buckets: list[int] = []
    while not buckets or buckets[-1] < prompt_bucket(max_prompt_tokens):
        buckets.append(prompt_bucket(buckets[-1] + 1 if buckets else 1))
    return [(1, canvas, bucket) for canvas in sorted(set(canvas_lengths)) for bucket in buckets]


def graph_constants(settings: SamplerSettings) -> SamplerSettings:
    """What a compiled step holds as constants: every setting but the step count (a tensor), sampling exactly."""
    return dataclasses.replace(settings, max_steps=1, exact=True)


class CapturedLoop:
    """Compiled steps for ``shapes``, warmed in the background; ``state`` is ``warming``, ``captured`` or
    ``failed: <reason>``."""

    def __init__(
        self,
        model: DiffusionGemmaForBlockDiffusion,
        settings: SamplerSettings,
        shapes: Sequence[Shape],
        mode: str = "reduce-overhead",
    ) -> None:
        self.model = model
        self.constants = graph_constants(settings)
        self.shapes = list(shapes)
        self.mode = mode
        self.state = "warming"
        self.warm_s = 0.0
        self.served = 0
        """Canvases denoised on a captured graph."""
        self._prompts: dict[Shape, StaticPrompt] = {}
        self._step: Step | None = None
        self._ready = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Compile and warm every shape in a background thread."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._warm, name="diffgemma-capture", daemon=True)
            self._thread.start()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until warming has ended (captured or failed); False on timeout or when never started."""
        return self._thread is not None and self._ready.wait(timeout)

    def serves(self, rows: int, canvas_length: int, prompt_length: int, settings: SamplerSettings) -> bool:
        """Whether a warmed graph serves this canvas (else the eager loop does)."""
        return (
            self.state == "captured"
            and (rows, canvas_length, prompt_bucket(prompt_length)) in self._prompts
            and graph_constants(settings) == self.constants
        )

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
        """``static.denoise_static`` on the warmed graph of these views' shape (``serves`` said yes)."""
        longest = max(view.get_seq_length() for view in views)
        prompt = self._prompts[(len(views), canvas_length, prompt_bucket(longest))]
        with grad_mode(self.model)():  # the buffers are inference tensors, written in place
            prompt.load(views)
        self.served += 1
        return denoise_static(
            self.model,
            prompt,
            dataclasses.replace(settings, exact=True),
            generator,
            should_stop,
            on_step,
            row_checks=row_checks,
            step=self._step,
            start=start,
        )

    def _warm(self) -> None:
        started = time.perf_counter()
        try:
            step = compile_step(self.model, self.constants, mode=self.mode)
            vocab = text_config_of(self.model.config).vocab_size
            device = execution_device(self.model)
            generator = torch.Generator(device=device).manual_seed(0)
            prompts = {}
            with grad_mode(self.model)():
                for shape in self.shapes:
                    rows, canvas_length, bucket = shape
                    views = []
                    for _ in range(rows):
                        ids = torch.randint(0, vocab, (1, bucket // 2 + 1), generator=generator, device=device)
                        view = DynamicCache(config=self.model.config.get_text_config(decoder=True))
                        encode_prompt(self.model, ids, view)
                        views.append(view)
                    prompt = StaticPrompt.allocate(self.model, views[0], rows, bucket, canvas_length)
                    prompt.load(views)
                    schedule = dataclasses.replace(self.constants, max_steps=2)
                    for _ in range(3):  # compile, then (CUDA graphs) record, then replay
                        denoise_static(self.model, prompt, schedule, generator, step=step)
                    prompts[shape] = prompt
        except Exception as exc:  # noqa: BLE001 - any compile failure leaves the eager loop serving, and says why
            reason = str(exc).splitlines()[0] if str(exc) else ""
            self.state = f"failed: {type(exc).__name__}: {reason}"
            logger.warning("capturing the denoising step failed; serving with the eager loop (%s)", self.state)
        else:
            self._prompts, self._step = prompts, step
            self.state = "captured"
            logger.info("denoising step captured for %d shapes in %.1f s", len(prompts), time.perf_counter() - started)
        finally:
            self.warm_s = round(time.perf_counter() - started, 1)
            self._ready.set()
