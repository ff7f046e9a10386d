"""Frames of the wire protocol (``protocol.py`` holds its messages): a 4-byte big-endian length, then that many
bytes of UTF-8 JSON, encoded and parsed with one cattrs converter that refuses values of the wrong JSON type, so a
bad frame is a ``ProtocolError`` that says what is wrong and how to answer it.
"""

from __future__ import annotations

import asyncio
import json
import struct

import cattrs
from cattrs.dispatch import StructureHook
from cattrs.preconf.json import make_converter
from cattrs.strategies import configure_tagged_union
from cattrs.v import format_exception

from .protocol import MESSAGE_TYPES, Error, ErrorCode, Message, StepReport

HEADER = struct.Struct(">I")
MAX_FRAME_BYTES = 8 * 1024 * 1024
"""Frames larger than this are refused with ``ErrorCode.TOO_LARGE``."""
DISCARD_LIMIT_BYTES = 64 * 1024 * 1024
"""An oversized frame up to this size is read and thrown away so the connection stays usable."""

converter = make_converter(forbid_extra_keys=False)


def valid_text(value: str) -> str:
    """``value`` with lone surrogates (legal in JSON, not in UTF-8) replaced by U+FFFD."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return value.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    return value


def _strict(kind: type, *more: type) -> StructureHook:
    """A structure hook that refuses values of the wrong JSON type instead of coercing them."""
    allowed = (kind, *more)

    def hook(value: object, _: type) -> object:
        if isinstance(value, bool) and kind is not bool or not isinstance(value, allowed):
            raise TypeError(f"expected {kind.__name__}, got {type(value).__name__}")
        return valid_text(value) if isinstance(value, str) else value

    return hook


converter.register_structure_hook(str, _strict(str))
converter.register_structure_hook(int, _strict(int))
converter.register_structure_hook(float, lambda v, _: float(_strict(float, int)(v, float)))
converter.register_structure_hook(bool, _strict(bool))
converter.register_structure_hook(StepReport, lambda value, _: StepReport.parse(_strict(str)(value, str)))
converter.register_unstructure_hook(StepReport, str)
_TAGS: dict[type, str] = {cls: tag for tag, cls in MESSAGE_TYPES.items()}
configure_tagged_union(Message, converter, tag_name="type", tag_generator=_TAGS.__getitem__)


class ProtocolError(Exception):
    """A frame that cannot be understood. ``code`` says how to answer it."""

    def __init__(self, code: ErrorCode, message: str, request_id: str | None = None, *, fatal: bool = False) -> None:
        super().__init__(message)
        self.code = code
        self.request_id = request_id
        self.fatal = fatal
        """True when the stream lost its frame alignment: answer, then close the connection."""

    def to_error(self) -> Error:
        """The wire answer to this fault."""
        return Error(code=self.code, message=str(self), id=self.request_id)


def encode(message: Message) -> bytes:
    """One frame: length header plus the JSON body."""
    raw = converter.unstructure(message, Message)
    try:
        body = json.dumps(raw, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:  # lone surrogates: JSON's \u escapes carry them
        body = json.dumps(raw).encode("ascii")
    if len(body) > MAX_FRAME_BYTES:
        raise ProtocolError(ErrorCode.TOO_LARGE, f"message of {len(body)} bytes exceeds {MAX_FRAME_BYTES}")
    return HEADER.pack(len(body)) + body


def _field_error(exc: BaseException, kind: type | None) -> str:
    """cattrs' description of a field's error, with a validator's own message (``seed must be from ...``)."""
    if type(exc) is ValueError:  # raised by a field validator (``_within``): its message names the bound
        return str(exc)
    return format_exception(exc, kind)


def decode(body: bytes) -> Message:
    """Parse one frame body into a message, or raise ``ProtocolError`` saying what is wrong."""
    try:
        raw = json.loads(body.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise ProtocolError(ErrorCode.BAD_REQUEST, f"frame is not valid UTF-8: {exc}") from None
    except json.JSONDecodeError as exc:
        raise ProtocolError(ErrorCode.BAD_REQUEST, f"frame is not valid JSON: {exc}") from None
    except RecursionError:
        raise ProtocolError(ErrorCode.BAD_REQUEST, "frame is not valid JSON: nested too deeply") from None
    if not isinstance(raw, dict):
        raise ProtocolError(ErrorCode.BAD_REQUEST, f"frame must be a JSON object, got {type(raw).__name__}")
    request_id = valid_text(raw["id"]) if isinstance(raw.get("id"), str) else None
    tag = raw.get("type")
    if not isinstance(tag, str) or tag not in MESSAGE_TYPES:
        known = ", ".join(sorted(MESSAGE_TYPES))
        raise ProtocolError(ErrorCode.UNKNOWN_TYPE, f"unknown message type {tag!r} (known: {known})", request_id)
    try:
        return converter.structure(raw, MESSAGE_TYPES[tag])
    except (cattrs.BaseValidationError, ValueError, TypeError, KeyError) as exc:
        detail = (
            "; ".join(cattrs.transform_error(exc, format_exception=_field_error))
            if isinstance(exc, cattrs.BaseValidationError)
            else exc
        )
        raise ProtocolError(ErrorCode.BAD_REQUEST, f"invalid {tag!r} message: {detail}", request_id) from None


async def read_message(reader: asyncio.StreamReader) -> Message:
    """Read one frame. Raises ``asyncio.IncompleteReadError`` at end of stream, ``ProtocolError`` on bad frames.

    A too-large frame is skipped (up to ``DISCARD_LIMIT_BYTES``) before ``ProtocolError`` is raised, so that
    the stream stays aligned on frame boundaries; beyond that limit the error is ``fatal``.
    """
    (length,) = HEADER.unpack(await reader.readexactly(HEADER.size))
    if length > MAX_FRAME_BYTES:
        if length <= DISCARD_LIMIT_BYTES:
            remaining = length
            while remaining:
                remaining -= len(await reader.readexactly(min(remaining, 1 << 20)))
        raise ProtocolError(
            ErrorCode.TOO_LARGE,
            f"frame of {length} bytes exceeds the limit of {MAX_FRAME_BYTES} bytes",
            fatal=length > DISCARD_LIMIT_BYTES,
        )
    return decode(await reader.readexactly(length))
