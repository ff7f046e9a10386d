"""The places an edit implies (diffgemma_lsp/jumps.py): the rename an edit made, the other uses of the old name, and
the one request that carries them all; the newest edit the history holds (``EditHistory.last_edit``)."""

from __future__ import annotations

import inspect
import io
import textwrap
import tokenize

import pytest

from diffgemma_engine.shared import protocol
from diffgemma_lsp.edit_history import BURST_GAP_S, EditHistory
from diffgemma_lsp.jumps import MAX_PLACES, Chain, Place, Rename, chain_request, places, renamed

RENAMES = {
    "a function at its definition": (["def total(items):\n"], ["def summed(items):\n"], Rename("total", "summed")),
    "a parameter used twice on its line": (
        ["def area(width, height): return width * height\n"],
        ["def area(size, height): return size * height\n"],
        Rename("width", "size"),
    ),
    "an attribute": (["        self._lock = lock\n"], ["        self._mutex = lock\n"], Rename("_lock", "_mutex")),
    "over two lines": (
        ["x = old_name(\n", "    old_name)\n"],
        ["x = new_name(\n", "    new_name)\n"],
        Rename("old_name", "new_name"),
    ),
}


@pytest.mark.parametrize("case", RENAMES, ids=list(RENAMES))
def test_the_rename_an_edit_made(case: str) -> None:
    old, new, expected = RENAMES[case]
    assert renamed(old, new) == expected


NOT_RENAMES = {
    "a value changed": (["limit = 10\n"], ["limit = 20\n"]),
    "a name became a call": (["x = y\n"], ["x = f(y)\n"]),
    "two different names renamed": (["a = b\n"], ["c = d\n"]),
    "a word added": (["return x\n"], ["return x + y\n"]),
    "nothing changed": (["pass\n"], ["pass\n"]),
    "an operator changed": (["x = 1\n"], ["x == 1\n"]),
}


@pytest.mark.parametrize("case", NOT_RENAMES, ids=list(NOT_RENAMES))
def test_an_edit_that_renames_nothing_implies_no_places(case: str) -> None:
    old, new = NOT_RENAMES[case]
    assert renamed(old, new) is None


def test_the_other_uses_come_after_the_edit_first_then_before_it_whole_words_only() -> None:
    lines = [
        "total_count = total(a)\n",  # 0: before the edit
        "def total(items):\n",  # 1: the edit
        "    return sum(items)\n",
        "subtotal = 1\n",  # not a use: part of another word
        "print(total([1]))  # total\n",  # 4
        "x = total\n",  # 5
    ]
    assert places(lines, "total", range(1, 2)) == [4, 5, 0]


def test_a_stdlib_functions_renamed_local_finds_its_uses_as_pythons_tokenizer_does() -> None:
    """Code nobody here wrote: textwrap's ``dedent``, its local ``margin`` renamed at its first assignment; its
    other uses are the lines where Python's own tokenizer reads the name ``margin`` (comments hold none)."""
    source = inspect.getsource(textwrap.dedent)
    lines = source.splitlines(keepends=True)
    first = next(index for index, line in enumerate(lines) if "margin = None" in line)
    rename = renamed([lines[first]], [lines[first].replace("margin", "common")])
    assert rename == Rename("margin", "common")
    tokens = tokenize.generate_tokens(io.StringIO(source).readline)
    uses = sorted({token.start[0] - 1 for token in tokens if token.type == tokenize.NAME and token.string == "margin"})
    after, before = [line for line in uses if line > first], [line for line in uses if line < first]
    assert places(lines, rename.old, range(first, first + 1)) == (after + before)[:MAX_PLACES]
    assert len(after) >= 3


def test_no_more_places_than_one_request_carries() -> None:
    lines = ["def f():\n"] + ["f()\n"] * 20
    assert len(places(lines, "f", range(0, 1))) == MAX_PLACES == protocol.MAX_WINDOWS + 1


def test_the_chain_is_one_request_with_the_other_places_as_windows() -> None:
    def request(index: int) -> protocol.Infill:
        start = [protocol.StartSegment(text=f"use_{index}\n")]
        return protocol.Infill(id="n", uri="u", prefix=f"p{index}", suffix=f"s{index}", start=start, candidates=2)

    chain = chain_request([request(0), request(1), request(2)])
    assert (chain.prefix, chain.suffix, chain.start, chain.candidates) == ("p0", "s0", request(0).start, 2)
    assert chain.windows == [
        protocol.Window(prefix="p1", suffix="s1", start=request(1).start),
        protocol.Window(prefix="p2", suffix="s2", start=request(2).start),
    ]


def test_the_last_edit_is_the_burst_being_typed_then_the_last_hunk() -> None:
    now = 0.0
    history = EditHistory(clock=lambda: now)
    before = ["def total(items):\n", "    return sum(items)\n"]
    after = ["def summed(items):\n", before[1]]
    assert history.last_edit("u", before) is None
    history.replaced("u", 0, before[:1], after[:1], before)
    typing = history.last_edit("u", after)
    assert typing is not None and (typing.start, typing.old, typing.new) == (0, tuple(before[:1]), tuple(after[:1]))
    now = BURST_GAP_S
    history.recent(lambda _: after, 10_000)  # the pause closes the burst
    closed = history.last_edit("u", after)
    assert closed is not None and (closed.old, closed.new) == (typing.old, typing.new)


def test_a_chain_offers_its_places_in_order_moved_by_the_edits_accepted_above_them() -> None:
    lines = ["a = old\n", "x\n", "b = old\n", "y\n", "c = old\n"]
    chain = Chain(
        [Place(2, 3, "b = old\n", "b = new\n"), Place(4, 5, "c = old\n", "c = new\n"), Place(3, 4, "gone\n", "z\n")]
    )
    chain.accepted(0, 1)  # the first place's edit added a line above both
    moved = ["a = new\n", "extra\n", *lines[1:]]
    assert chain.next_place(moved) == Place(3, 4, "b = old\n", "b = new\n")
    chain.accepted(3, 0)
    moved[3] = "b = new\n"
    assert chain.next_place(moved) == Place(5, 6, "c = old\n", "c = new\n")
    assert chain.next_place(moved) is None  # the last place no longer holds what it held
    assert chain.places == []
