"""The ring buffer of extra context chunks."""

from __future__ import annotations

from diffgemma_lsp.extra_context import ExtraContext, chunk_around

TEXT = "".join(f"line {n}\n" for n in range(200))


def test_chunk_is_centred_and_clamped() -> None:
    assert chunk_around(TEXT, 100, 4) == "line 98\nline 99\nline 100\nline 101\n"
    assert chunk_around(TEXT, 0, 3) == "line 0\nline 1\nline 2\n"
    assert chunk_around(TEXT, 199, 3) == "line 197\nline 198\nline 199\n"


def test_other_files_newest_kept_within_budget_in_stable_order() -> None:
    ring = ExtraContext(size=3)
    for name in ("a", "b", "c", "d"):
        ring.add(f"file:///{name}.py", f"def {name}(): pass\n")
    names = [chunk.name for chunk in ring.for_request("file:///z.py", 10_000)]
    assert names == ["b.py", "c.py", "d.py"]  # "a" evicted; oldest first
    assert [c.name for c in ring.for_request("file:///c.py", 10_000)] == ["b.py", "d.py"]
    assert [c.name for c in ring.for_request("file:///z.py", 40)] == ["c.py", "d.py"]  # the newest that fit
    ring.add("file:///e.py", "".join(f"def e{i}(): pass\n" for i in range(64)))  # a chunk larger than the budget
    (head,) = ring.for_request("file:///z.py", 40)
    assert (head.name, head.text) == ("e.py", "def e0(): pass\ndef e1(): pass\n")  # the whole lines that fit
    assert [c.text for c in ring.for_request("file:///z.py", 10)] == []  # not even one line


def test_an_unchanged_chunk_keeps_its_place() -> None:
    ring = ExtraContext()
    ring.add("file:///a.py", "x = 1\n")
    ring.add("file:///b.py", "y = 2\n")
    ring.add("file:///a.py", "x = 1\n")
    assert [c.name for c in ring.for_request("file:///z.py", 100)] == ["a.py", "b.py"]
    ring.add("file:///a.py", "x = 3\n")
    assert [c.name for c in ring.for_request("file:///z.py", 100)] == ["b.py", "a.py"]
    ring.remove("file:///b.py")
    assert [c.name for c in ring.for_request("file:///z.py", 100)] == ["a.py"]


def test_blank_files_are_skipped() -> None:
    ring = ExtraContext()
    ring.add("file:///empty.py", "\n\n")
    assert ring.for_request("file:///z.py", 100) == []


def test_edits_become_chunks_once_the_user_works_elsewhere() -> None:
    ring = ExtraContext()
    texts = {"file:///a.py": TEXT}
    ring.note_edit("file:///a.py", 150)
    ring.take_edits("file:///a.py", texts.get)  # still typing in a.py: nothing changes
    assert ring.for_request("file:///z.py", 10_000) == []
    ring.take_edits("file:///z.py", texts.get)  # now in z.py: a.py's edited region is context
    (chunk,) = ring.for_request("file:///z.py", 10_000)
    assert "line 150\n" in chunk.text and chunk.text.startswith("line 118\n")


def test_a_huge_line_is_cut_and_the_ring_stays_small() -> None:
    from diffgemma_lsp.extra_context import CHUNK_CHARS, RING_SIZE, ExtraContext

    ring = ExtraContext()
    for n in range(RING_SIZE + 4):
        ring.add(f"file:///min{n}.js", "x" * 20_000_000)  # a minified file: one 20 MB line
    chunks = ring.for_request("file:///other.py", 10**9)
    assert len(chunks) == RING_SIZE and all(len(chunk.text) == CHUNK_CHARS for chunk in chunks)
