"""The other places an edit implies (issue 45, next edits that jump): after a rename, the other uses of the old name.

Pure: no LSP, no I/O. An edit renamed a name when, word for word, its old lines and its new ones differ in one name
only (each of its uses there renamed alike). The other places are the document's other lines that use the old name
as a whole word, the ones after the edit first (where the user reads on), then the ones before it, at most
``MAX_PLACES``. Each place is one window of a next edit, and their windows ride in one request
(``chain_request``: ``Infill.windows``), so that each Tab of the chain finds its edit computed.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Sequence

import attrs

from diffgemma_engine.shared import protocol
from diffgemma_lsp.edit_history import Hunk
from diffgemma_lsp.settings import Settings

WORD = re.compile(r"\w+|[^\w\s]")
"""A word (a name, a number) or one other character that is not a space: what an edit is compared by."""
NAME = re.compile(r"[^\W\d]\w*")
MAX_PLACES = protocol.MAX_WINDOWS + 1
"""The most places of one chain: one request's own window and its ``windows``."""
CHAIN_WINDOW_LINES = 0
"""Lines above and below a place in its window: the place's line alone, so that each place is an edit of its own
(one Tab each) and a window never reaches the next place."""


@attrs.frozen
class Rename:
    """``old`` became ``new`` in an edit."""

    old: str
    new: str


def renamed(old_lines: Sequence[str], new_lines: Sequence[str]) -> Rename | None:
    """The rename an edit made (its lines before and after), or None: the words differ at one or more spots, each a
    single name that became one other name, the same pair at every spot."""
    old, new = WORD.findall("".join(old_lines)), WORD.findall("".join(new_lines))
    pairs = set()
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(a=old, b=new, autojunk=False).get_opcodes():
        if tag == "equal":
            continue
        if tag != "replace" or i2 - i1 != 1 or j2 - j1 != 1:
            return None
        pairs.add((old[i1], new[j1]))
    if len(pairs) != 1:
        return None
    before, after = pairs.pop()
    return Rename(before, after) if NAME.fullmatch(before) and NAME.fullmatch(after) else None


def uses(line: str, name: str) -> bool:
    """Whether ``line`` uses ``name`` as a whole word."""
    return name in WORD.findall(line)


def places(lines: Sequence[str], name: str, edited: range) -> list[int]:
    """The lines (0-based) outside ``edited`` that use ``name``: after it first, then before it, at most
    ``MAX_PLACES``."""
    after = [index for index in range(edited.stop, len(lines)) if uses(lines[index], name)]
    before = [index for index in range(0, min(edited.start, len(lines))) if uses(lines[index], name)]
    return (after + before)[:MAX_PLACES]


def implied(edit: Hunk | None, lines: Sequence[str]) -> list[int]:
    """The places ``edit`` (the user's last, in the document of ``lines``) implies: the other uses of a name it
    renamed (``places``); none for another edit."""
    rename = renamed(edit.old, edit.new) if edit is not None else None
    if edit is None or rename is None:
        return []
    return places(lines, rename.old, range(edit.start, edit.start + len(edit.new)))


def chain_settings(settings: Settings) -> Settings:
    """The settings a place's window is asked with: ``settings`` with its window narrowed to the place's line."""
    return attrs.evolve(settings, next_edit_lines=CHAIN_WINDOW_LINES)


def chain_request(requests: Sequence[protocol.Infill]) -> protocol.Infill:
    """One request for the rewrites of several places of one document (each as a next edit asks it, the same
    settings): the first place's, with the others as its ``windows``, denoised in one batch."""
    first, *others = requests
    windows = [protocol.Window(prefix=other.prefix, suffix=other.suffix, start=other.start) for other in others]
    return attrs.evolve(first, windows=windows)


@attrs.frozen
class Place:
    """A later place of a chain as it was computed: its window's lines ``first`` to ``end`` (exclusive) held
    ``old``, and the model wrote ``new`` there."""

    first: int
    end: int
    old: str
    new: str


@attrs.define
class Chain:
    """The later places of a chain, computed in one batch with the first: each accepted edit offers the next."""

    places: list[Place]
    """The places not offered yet, in order."""
    moved: list[tuple[int, int]] = attrs.field(factory=list)
    """(line, lines added) of each edit of the chain accepted so far: the places below it moved by as much."""

    def accepted(self, line: int, added: int) -> None:
        """An edit of the chain at ``line`` was accepted; it added ``added`` lines (fewer than 0: removed)."""
        self.moved.append((line, added))

    def next_place(self, lines: Sequence[str]) -> Place | None:
        """The next place whose window still holds what it held (``lines``: the document now), moved to where it is
        now; the places passed over (changed since) are dropped. None when none is left."""
        while self.places:
            place = self.places.pop(0)
            shift = sum(added for line, added in self.moved if line < place.first)
            first, end = place.first + shift, place.end + shift
            if 0 <= first and "".join(lines[first:end]) == place.old:
                return attrs.evolve(place, first=first, end=end)
        return None
