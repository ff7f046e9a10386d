"""The FIM layout and the budget's cuts, with one token per character (the chat layout is tested with the
release-format tokenizer in tests/engine/test_chat_layout.py)."""

from __future__ import annotations

from diffgemma_engine.shared import budget
from diffgemma_engine.shared.prompt import (
    ChatTemplate,
    PromptParts,
    SpecialIds,
    build_chat_prompt,
    build_fim_prompt,
    char_budget_cut,
    special_ids_from,
)

SPECIAL = SpecialIds(bos=2, fim_prefix=4, fim_suffix=5, fim_middle=6, file_sep=7)


def encode(text: str) -> list[int]:
    """One token per character, offset past the special ids."""
    return [100 + ord(c) for c in text]


def decode(ids: list[int]) -> str:
    return "".join(chr(i - 100) for i in ids)


def test_suffix_first_then_prefix_then_middle() -> None:
    prompt = build_fim_prompt(PromptParts(prefix="abc", suffix="xyz"), encode, SPECIAL, 100)
    assert prompt.ids == [2, 5, *encode("xyz"), 4, *encode("abc"), 6]
    assert not prompt.truncated


def test_cut_keeps_the_end_of_the_prefix_and_the_start_of_the_suffix_on_line_boundaries() -> None:
    prefix = "".join(f"p{i:02d}\n" for i in range(20)) + "END"
    suffix = "START\n" + "".join(f"s{i:02d}\n" for i in range(20))
    prompt = build_fim_prompt(PromptParts(prefix=prefix, suffix=suffix), encode, SPECIAL, 44)
    assert len(prompt.ids) <= 44
    assert prompt.truncated
    kept_suffix = decode(prompt.ids[prompt.ids.index(5) + 1 : prompt.ids.index(4)])
    kept_prefix = decode(prompt.ids[prompt.ids.index(4) + 1 : -1])
    assert kept_prefix.endswith("END") and prefix.endswith(kept_prefix) and kept_prefix.startswith("p")
    assert kept_suffix.startswith("START") and suffix.startswith(kept_suffix) and kept_suffix.endswith("\n")
    assert prompt.prefix_tokens > prompt.suffix_tokens


def test_short_suffix_leaves_room_for_more_prefix() -> None:
    prefix = "".join(f"line {i:03d}\n" for i in range(100))
    prompt = build_fim_prompt(PromptParts(prefix=prefix, suffix="s"), encode, SPECIAL, 204)
    assert prompt.suffix_tokens == 1
    assert 204 - 4 - 1 - 2 * len("line 000\n") < prompt.prefix_tokens <= 204 - 4 - 1


def test_the_cut_stays_put_while_the_user_types() -> None:
    """Successive keystrokes share the prompt up to the cursor: the cut moves in blocks, seldom."""
    document = "".join(f"    value_{i} = compute({i})\n" for i in range(200))
    moves, previous = 0, None
    for typed in range(1, 120):
        prefix = document + "    result = " + "x" * typed
        ids = build_fim_prompt(PromptParts(prefix=prefix, suffix="\nreturn\n"), encode, SPECIAL, 600).ids
        head = ids[: ids.index(4) + 40]
        moves += previous is not None and head != previous
        previous = head
    assert moves <= 2


def test_extra_chunks_come_first_and_only_while_they_fit() -> None:
    parts = PromptParts(prefix="ab", suffix="", extra=[("one.py", "x"), ("two.py", "y" * 500)])
    prompt = build_fim_prompt(parts, encode, SPECIAL, 100)
    assert prompt.ids[:2] == [2, 7]
    assert decode(prompt.ids[2 : 2 + 8]) == "one.py\nx"
    assert prompt.ids.count(7) == 1
    assert prompt.truncated


def test_a_small_chunk_after_one_too_big_still_goes_in_each_layout() -> None:
    """The last chunk (the definitions at the cursor) is small and the most needed: one before it that does not fit
    leaves it in."""
    extra = [("one.py", "x"), ("two.py", "y" * 500), ("defs.py", "z")]
    fim = build_fim_prompt(PromptParts(prefix="ab", suffix="", extra=extra), encode, SPECIAL, 100)
    text = decode([i for i in fim.ids if i >= 100])
    assert "defs.py\nz" in text and "one.py\nx" in text and "yyy" not in text and fim.truncated
    template = ChatTemplate(head=(2,), tail=(3,))
    chat = build_chat_prompt(PromptParts(prefix="ab", suffix="", extra=extra), encode, template, 1200)
    text = decode([i for i in chat.ids if i >= 100])
    assert "File defs.py" in text and "File one.py" in text and "yyy" not in text and chat.truncated


def test_blocks_of_lines_fit_the_budget_and_fall_back_to_lines_then_characters() -> None:
    text = "".join(f"{i:04d}\n" for i in range(30))  # 5 characters a line
    assert budget.cut_prefix(text, 23, len, lines_per_block=2) == "".join(f"{i:04d}\n" for i in range(26, 30))
    assert budget.cut_suffix(text, 23, len, lines_per_block=2) == "".join(f"{i:04d}\n" for i in range(4))
    assert budget.cut_prefix(text, 7, len, lines_per_block=4) == "0029\n"  # the block at the cursor is too big
    assert budget.cut_prefix("a" * 50, 7, len) == "a" * 7  # one line longer than the budget
    assert budget.cut_suffix("b" * 50 + "\nrest", 7, len) == "b" * 7
    assert budget.cut_prefix(text, 0, len) == "" and budget.cut_suffix("", 9, len) == ""


def test_fit_gives_the_room_one_side_leaves_to_the_other() -> None:
    prefix = "".join(f"{i:04d}\n" for i in range(40))
    cut = budget.fit(prefix, "tail", 100, len)
    assert cut.suffix == "tail" and cut.truncated and 90 <= len(cut.prefix) <= 96
    cut = budget.fit("head", prefix, 100, len)
    assert cut.prefix == "head" and 90 <= len(cut.suffix) <= 96
    both = budget.fit(prefix, prefix, 100, len)
    assert len(both.prefix) + len(both.suffix) <= 100 and len(both.suffix) <= 25
    assert budget.fit("a", "b", 10, len) == budget.Cut(prefix="a", suffix="b", truncated=False)


def test_special_ids_need_all_three_sentinels() -> None:
    vocab = {"<fim_prefix>": 4, "<fim_suffix>": 5, "<fim_middle>": 6, "<bos>": 2}
    assert special_ids_from(vocab.get) == SpecialIds(bos=2, fim_prefix=4, fim_suffix=5, fim_middle=6, file_sep=None)
    del vocab["<fim_middle>"]
    assert special_ids_from(vocab.get) is None


def test_the_character_cut_keeps_the_text_next_to_the_cursor_on_line_boundaries() -> None:
    parts = char_budget_cut(PromptParts(prefix="a\n" * 10 + "B", suffix="C\n" + "d\n" * 10), 16)
    assert parts.prefix.endswith("\nB") and parts.prefix.startswith("a") and len(parts.prefix) <= 12
    assert parts.suffix.startswith("C\n") and parts.suffix.endswith("\n") and len(parts.suffix) <= 4


def test_other_files_too_long_to_fit_are_not_tokenized() -> None:
    """A 7 MB chunk is dropped before the tokenizer sees it (it held the model thread for seconds)."""
    from diffgemma_engine.request.infill import build_prompt
    from diffgemma_engine.shared import protocol

    seen: list[int] = []

    class Layout:
        name = "fim"

        def prompt(self, parts: PromptParts, max_tokens: int):
            seen.extend(len(text) for _, text in parts.extra)
            return build_fim_prompt(parts, encode, SPECIAL, max_tokens)

    class Loaded:
        max_prompt_tokens = 1024
        layout = Layout()

    chunks = [protocol.Chunk(filename="a.py", text="a = 1\n"), protocol.Chunk(filename="big.js", text="x" * 7_000_000)]
    request = protocol.Infill(id="1", uri="u", prefix="def f():\n", extra=chunks)
    build_prompt(Loaded(), request)  # type: ignore[arg-type]
    assert seen == [6]
