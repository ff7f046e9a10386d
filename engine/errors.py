"""Engine errors, each with the wire code it is reported under."""

from __future__ import annotations

import site
import sysconfig
from pathlib import Path

from .shared.protocol import Error, ErrorCode

LIBRARY_PATHS = ("stdlib", "platstdlib", "purelib", "platlib")
# The package's folder, and where a strict editable install links it from (its files' paths in tracebacks).
_PLACES = [str(Path(__file__).resolve().parent), str(Path(__file__).parent), *site.getsitepackages()]
SERVER_PATHS = sorted(
    {place for place in [*_PLACES, *(sysconfig.get_paths().get(key, "") for key in LIBRARY_PATHS)] if place},
    key=len,
    reverse=True,
)
"""Where the engine's own code lives (its package, the installed libraries): left out of what a refusal says."""


class EngineError(Exception):
    """Base class; ``CODE`` is what the client sees."""

    CODE = ErrorCode.INTERNAL

    def to_wire(self, request_id: str | None) -> Error:
        """The ``Error`` message for this fault."""
        return Error(code=self.CODE, message=str(self), id=request_id)


class ModelLoadError(EngineError):
    """The checkpoint could not be loaded."""

    CODE = ErrorCode.MODEL_ERROR


class BusyError(EngineError):
    """The queue is full."""

    CODE = ErrorCode.BUSY


class BadRequestError(EngineError):
    """A well-formed message with values the engine cannot serve."""

    CODE = ErrorCode.BAD_REQUEST


def describe(exc: BaseException) -> str:
    """What went wrong, for a refusal on a boundary (the socket, the command line): an engine error's own message,
    else the error's type and message; no traceback, and none of the engine's own source paths (the user's paths,
    such as the model folder, stay)."""
    text = str(exc) if isinstance(exc, EngineError) else f"{type(exc).__name__}: {exc}"
    for path in SERVER_PATHS:
        text = text.replace(path, "<engine>")
    return text
