"""``diffgemma-engine serve``'s options, declared once for both sides of the process boundary: the engine's command
line reads them into a :class:`ServeOptions` (``diffgemma_engine.__main__``), and the language server's engine
launcher (``diffgemma_lsp.backends.connect``) writes one as the command line it starts (:meth:`ServeOptions.argv`).
The choices it offers (``RUNTIMES``, ``STEP_MODES``) are the ones its settings offer. Standard library and attrs
only: the language server imports it without torch."""

from __future__ import annotations

import enum
from pathlib import Path

import attrs

DEFAULT_MAX_PENDING = 64
"""Live jobs the queue holds before it answers ``busy`` (``serve --max-pending``)."""
DEFAULT_MAX_BATCH = 4
"""Queued jobs the model thread takes together into one decoder pass (``serve --max-batch``; 1: none)."""


class Runtime(enum.StrEnum):
    """What runs the canvases (``serve --runtime``)."""

    TRANSFORMERS = "transformers"
    VLLM = "vllm"
    AUTO = "auto"


class StepMode(enum.Enum):
    """How the engine's own loop runs the one denoising step (``serve --step``), chosen once per engine. Every mode
    runs ``diffgemma_engine.canvas.step.denoise_step``; they differ in what is compiled around it."""

    AUTO = "auto"
    """The default: ``CAPTURED`` on a CUDA device (CUDA graphs take the host out of the step, and the eager loop
    serves until they are captured, or for good when they cannot be), ``EAGER`` elsewhere (on a CPU the captured
    step gains little, and MPS has no graphs)."""
    EAGER = "eager"
    """Op by op (``canvas.denoise.denoise_canvas``): the exact or the fast sampler, every shape."""
    COMPILED = "compiled"
    """The decoder pass and scores under ``torch.compile`` with dynamic shapes (``canvas.compiled.DecoderStep``),
    compiled in the background: served eagerly until then."""
    CAPTURED = "captured"
    """The whole step compiled as one graph per serving shape on fixed buffers (``canvas.captured.CapturedLoop``; a
    CUDA graph on a GPU), warmed in the background; the eager loop serves until then, and serves batches,
    candidates and rewrites with held text."""

    def on(self, device_type: str) -> StepMode:
        """The mode that runs on a model whose inputs are on ``device_type`` (``AUTO`` decided; the others as they
        are)."""
        if self is not StepMode.AUTO:
            return self
        return StepMode.CAPTURED if device_type == "cuda" else StepMode.EAGER


RUNTIMES: tuple[str, ...] = tuple(runtime.value for runtime in Runtime)
"""``serve --runtime``'s choices."""
STEP_MODES: tuple[str, ...] = tuple(mode.value for mode in StepMode)
"""``serve --step``'s choices."""


@attrs.frozen(kw_only=True)
class ServeOptions:
    """The options of ``serve`` as parsed (defaults are "not asked for"). ``api_key`` is not on the command line
    (``$DIFFGEMMA_VLLM_API_KEY``)."""

    engine_socket: Path
    model: str | None = None
    device: str = "auto"
    dtype: str = "auto"
    quantization: str | None = None
    max_memory: str | None = None
    threads: int | None = None
    max_pending: int = DEFAULT_MAX_PENDING
    max_batch: int = DEFAULT_MAX_BATCH
    step: str = StepMode.AUTO.value
    idle_exit: float | None = 0.0
    """Seconds without clients before the engine exits (0: never; None: ``auto``, by how long loading took)."""
    exist_ok: bool = False
    runtime: Runtime = Runtime.AUTO
    vllm_command: str = ""
    vllm_socket: Path | None = None
    vllm_url: str = ""
    vllm_plain_http: bool = False
    """``--vllm-plain-http``: the user says plain http:// to another machine is what they want."""
    vllm_model: str = ""
    api_key: str = attrs.field(default="", repr=False)

    def own_loop_options(self) -> list[str]:
        """The options given that only the engine's own loop takes."""
        given = {
            "--dtype": self.dtype != "auto",
            "--quantization": self.quantization is not None,
            "--max-memory": self.max_memory is not None,
            "--step": self.step not in ("auto", "eager"),  # eager: nothing compiled, nothing to refuse
        }
        return [flag for flag, asked in given.items() if asked]

    def argv(self) -> list[str]:
        """``serve`` and its options as the engine's command line reads them back into these options (the
        device, idle exit, runtime and step always said; the rest when given)."""
        idle = "auto" if self.idle_exit is None else _number(self.idle_exit)
        argv = ["serve", "--socket", str(self.engine_socket), "--device", self.device, "--idle-exit", idle]
        argv += ["--exist-ok"] * self.exist_ok + ["--runtime", self.runtime.value, "--step", self.step]
        given = {
            "--model": self.model,
            "--dtype": self.dtype if self.dtype != "auto" else None,
            "--quantization": self.quantization,
            "--max-memory": self.max_memory,
            "--threads": self.threads,
            "--max-pending": self.max_pending if self.max_pending != DEFAULT_MAX_PENDING else None,
            "--max-batch": self.max_batch if self.max_batch != DEFAULT_MAX_BATCH else None,
            "--vllm-command": self.vllm_command,
            "--vllm-socket": self.vllm_socket,
            "--vllm-url": self.vllm_url,
            "--vllm-model": self.vllm_model,
        }
        for flag, value in given.items():
            if value is not None and value != "":
                argv += [flag, str(value)]
        return argv + ["--vllm-plain-http"] * self.vllm_plain_http


def _number(seconds: float) -> str:
    """Seconds as the command line reads them: ``1800``, not ``1800.0``."""
    return str(int(seconds)) if float(seconds).is_integer() else str(seconds)
