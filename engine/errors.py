"""Engine errors, each with the wire code it is reported under."""

from __future__ import annotations

from .protocol import Error, ErrorCode


class EngineError(Exception):
    """Base class; ``CODE`` is what the client sees."""

    CODE = ErrorCode.INTERNAL

    def to_wire(self, request_id: str | None) -> Error:
        """The ``Error`` message for this fault."""
        return Error(code=self.CODE, message=str(self), id=request_id)


class ModelLoadError(EngineError):
    """The checkpoint could not be loaded."""

    CODE = ErrorCode.MODEL_ERROR


class NotReadyError(EngineError):
    """The model is still loading."""

    CODE = ErrorCode.NOT_READY


class BusyError(EngineError):
    """The queue is full."""

    CODE = ErrorCode.BUSY


class BadRequestError(EngineError):
    """A well-formed message with values the engine cannot serve."""

    CODE = ErrorCode.BAD_REQUEST
