"""Who owns a document's engine request: one owner per document, the one rule for which request goes first.

The engine keeps one request per document and client (a newer one supersedes the one before), so the language
server sends one at a time for each document, and decides here which one that is:

- a request the user asked for wins: a rewrite stops a completion or a next edit in flight for the document, and
  no completion or next edit stops a rewrite (they are answered empty while it runs);
- a completion (typed or invoked) stops a next edit, and a newer completion stops an older one (latest wins);
- a next edit, whether the server computes it ahead or an editor asks for it on its own (Neovim 300 ms after a
  change), never stops a completion or a rewrite: it is "no edit" while one is in flight.

Requests of the same kind: the newer wins. ``DocumentOwners.claim`` applies the rule; the session holds the one map
(``session.py``), and every feature that sends a request for a document (``features/``) goes through it.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Callable
from typing import Any

import attrs


class Kind(enum.IntEnum):
    """What a request is, by rank: a request of a lower rank never stops one of a higher rank."""

    NEXT_EDIT = 0
    """A next edit: a guess, computed ahead by the server or asked by an editor on its own."""
    COMPLETION = 1
    """A completion, typed or invoked (and its debounce)."""
    REWRITE = 2
    """A rewrite of a selection: the user asked for it and waits for it."""

    @property
    def label(self) -> str:
        """What the user calls it: "next edit", "completion", "rewrite"."""
        return self.name.lower().replace("_", " ")


def superseded(kind: Kind) -> str:
    """Why a request stopped when a newer one of ``kind`` took its document."""
    return f"superseded by a newer {kind.label} of this document"


@attrs.define(eq=False)
class Owner:
    """One request that owns its document in the engine."""

    kind: Kind
    work: asyncio.Future[Any]
    """The request's work: done, it owns the document no more."""
    stop: Callable[[str], object]
    """Stops the request, saying why (its answer says so)."""


class DocumentOwners:
    """The request in flight per document uri (see the module's docstring for the rule)."""

    def __init__(self) -> None:
        self._owners: dict[str, Owner] = {}

    def claim(
        self, uri: str, kind: Kind, work: asyncio.Future[Any], stop: Callable[[str], object] | None = None
    ) -> bool:
        """Make ``work`` (a request of ``kind``) the owner of ``uri``: the owner before it is stopped (``superseded``),
        unless it outranks ``kind``; then nothing changes and the answer is False. ``work`` leaves when it is done;
        ``stop`` stops it, given why (default: cancels it)."""
        current = self._current(uri)
        if current is not None and current.kind > kind:
            return False
        owner = Owner(kind, work, stop or (lambda _why: work.cancel()))
        self._owners[uri] = owner
        if current is not None:
            current.stop(superseded(kind))
        work.add_done_callback(lambda _: self._release(uri, owner))
        return True

    def _current(self, uri: str) -> Owner | None:
        owner = self._owners.get(uri)
        if owner is not None and owner.work.done():
            self._release(uri, owner)  # before its done callback has run
            return None
        return owner

    def _release(self, uri: str, owner: Owner) -> None:
        if self._owners.get(uri) is owner:
            del self._owners[uri]

    def kind(self, uri: str) -> Kind | None:
        """The kind of the request in flight for ``uri``, or None."""
        owner = self._current(uri)
        return owner.kind if owner is not None else None

    def stop(self, uri: str, reason: str) -> None:
        """Stop whatever is in flight for ``uri`` (a document closed or opened anew: ``reason``)."""
        if (owner := self._owners.pop(uri, None)) is not None:
            owner.stop(reason)

    def __len__(self) -> int:
        return sum(not owner.work.done() for owner in self._owners.values())
