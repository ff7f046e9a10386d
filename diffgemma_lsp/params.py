"""Reading a request's params: an InvalidParams error that says what is wrong with them (cut to
``MAX_MESSAGE_CHARS``), and ``diffgemma/nextEdit``'s own params."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypeGuard

import attrs
from lsprotocol import types
from lsprotocol.validators import INTEGER_MAX_VALUE, INTEGER_MIN_VALUE, UINTEGER_MAX_VALUE
from pygls.exceptions import JsonRpcInvalidParams

NEXT_EDIT_METHOD = "diffgemma/nextEdit"

MAX_MESSAGE_CHARS = 400
"""An error message quotes at most this much of a bad argument."""


def invalid_params(method: str, message: str) -> JsonRpcInvalidParams:
    """The InvalidParams error of ``method`` (a command or request) saying ``message``, cut to
    ``MAX_MESSAGE_CHARS``."""
    if len(message) > MAX_MESSAGE_CHARS:
        message = message[: MAX_MESSAGE_CHARS - 1] + "…"
    return JsonRpcInvalidParams(f"{method}: {message}" if method else message)


def lsp_integer(value: object, low: int, high: int) -> TypeGuard[int]:
    """Whether ``value`` is an integer (not a bool, not a float) from ``low`` to ``high``: LSP's ranges."""
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


@attrs.frozen(kw_only=True)
class NextEditArguments:
    """``{"textDocument": {"uri", "version"}, "position"}``."""

    uri: str
    version: int
    position: types.Position


def next_edit_invalid(message: str) -> JsonRpcInvalidParams:
    """The InvalidParams error of ``diffgemma/nextEdit`` saying ``message``."""
    return invalid_params(NEXT_EDIT_METHOD, message)


def _field(raw: object, name: str) -> object:
    """``raw[name]`` of a JSON object as pygls hands a custom method's params over (a mapping, or an object with
    attributes)."""
    if isinstance(raw, Mapping):
        return raw.get(name)
    return getattr(raw, name, None)


def parse_arguments(params: object) -> NextEditArguments:
    """The request's params, or an InvalidParams error that says what is wrong with them."""
    document = _field(params, "textDocument")
    uri, version = _field(document, "uri"), _field(document, "version")
    position = _field(params, "position")
    line, character = _field(position, "line"), _field(position, "character")
    if not isinstance(uri, str) or not uri:
        raise next_edit_invalid(f"textDocument.uri must be the document's URI, got {uri!r}")
    if not lsp_integer(version, INTEGER_MIN_VALUE, INTEGER_MAX_VALUE):
        raise next_edit_invalid(f"textDocument.version must be the document's version, an integer, got {version!r}")
    if not (lsp_integer(line, 0, UINTEGER_MAX_VALUE) and lsp_integer(character, 0, UINTEGER_MAX_VALUE)):
        raise next_edit_invalid(f"position needs a line and a character, both integers of 0 or more, got {position!r}")
    return NextEditArguments(uri=uri, version=version, position=types.Position(line=line, character=character))
