"""The enumerated values the wire carries (``diffgemma_engine.shared.protocol`` re-exports them): why a request
was refused, why a canvas stopped, how a model is prompted, where a cursor stands, how the step runs. Each is a
plain string on the wire; an unknown one is refused when a frame is read."""

from __future__ import annotations

import enum

import attrs


class Layout(enum.Enum):
    """How a model is prompted (``HelloOk.layout``, ``Ready.layout``)."""

    NOT_KNOWN = ""
    """Not known yet: the model is still loading."""
    FIM = "fim"
    """FIM sentinels around the prefix and suffix; the answer is the middle as written."""
    CHAT = "chat"
    """An instruction model, prompted in its chat template: its answer may come fenced or echo the code around the
    cursor (see ``diffgemma_lsp.postprocess.answer``)."""


class ErrorCode(enum.Enum):
    """Why a request or a frame was refused."""

    BAD_REQUEST = "bad_request"
    TOO_LARGE = "too_large"
    UNKNOWN_TYPE = "unknown_type"
    VERSION_MISMATCH = "version_mismatch"
    NOT_READY = "not_ready"
    BUSY = "busy"
    PERMISSION_DENIED = "permission_denied"
    MODEL_ERROR = "model_error"
    INTERNAL = "internal"


class StopReason(enum.Enum):
    """Why a canvas stopped."""

    EOS = "eos"
    """The model wrote end-of-sequence: the completion is whole."""
    LENGTH = "length"
    """The canvas filled without an end-of-sequence."""
    CANCELLED = "cancelled"
    SUPERSEDED = "superseded"
    DEADLINE = "deadline"
    """The deadline ran out; ``text`` is the best canvas so far."""


class StepState(enum.Enum):
    """How the engine runs its denoising step now (``Stats.compiled``), for ``serve --step``."""

    NOT_LOADED = ""
    """No model loaded yet."""
    EAGER = "eager"
    """Op by op (``--step eager``)."""
    COMPILING = "compiling"
    """``--step compiled``: compiling in the background, served eagerly meanwhile."""
    COMPILED = "compiled"
    FAILED = "failed"
    """Compiling failed (the reason follows); served eagerly."""
    LOOP_WARMING = "loop warming"
    """``--step captured``: capturing the step per serving shape, served eagerly meanwhile."""
    LOOP_CAPTURED = "loop captured"
    LOOP_FAILED = "loop failed"
    """Capturing failed (the reason follows); served with the eager loop."""


@attrs.frozen
class StepReport:
    """A :class:`StepState` and, for a failure, why. On the wire one string, ``state`` or ``state: reason``
    (``loop failed: RuntimeError: no C++ compiler found``), as the engine reported it before it was typed."""

    state: StepState
    reason: str = ""

    def __str__(self) -> str:
        return f"{self.state.value}: {self.reason}" if self.reason else self.state.value

    @classmethod
    def parse(cls, text: str) -> StepReport:
        """The report ``text`` spells; ``ValueError`` for a state not in :class:`StepState`."""
        state, _, reason = text.partition(": ")
        return cls(StepState(state), reason)


class Scope(enum.Enum):
    """Where the cursor stands (``Infill.scope``), which picks the canvas a model with a ``line_canvas_length``
    hint uses."""

    MODEL = ""
    """Not said: the model's canvas."""
    LINE = "line"
    """Code precedes the cursor on its line: the answer is most likely the rest of that line (the shorter canvas)."""
    BLOCK = "block"
    """At the start of a line, or after a block opener: the answer may be lines (the model's canvas)."""
