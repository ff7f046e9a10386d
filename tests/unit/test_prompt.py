"""Prompt layout: sentinel order, budgets, and which end of each part survives a cut."""

from __future__ import annotations

from engine.prompt import (
    CURSOR_MARK,
    ChatLayout,
    FimLayout,
    PromptParts,
    SpecialIds,
    build_fim_prompt,
    chat_user_text,
    layout_for,
    special_ids_from,
    trim_chars,
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


def test_cut_keeps_the_end_of_the_prefix_and_the_start_of_the_suffix() -> None:
    prefix, suffix = "p" * 50 + "END", "START" + "s" * 50
    prompt = build_fim_prompt(PromptParts(prefix=prefix, suffix=suffix), encode, SPECIAL, 44)
    assert len(prompt.ids) <= 44
    assert prompt.truncated
    text = decode([i for i in prompt.ids if i >= 100])
    assert text.startswith("START") and text.endswith("END")
    assert prompt.prefix_tokens > prompt.suffix_tokens


def test_short_suffix_leaves_room_for_more_prefix() -> None:
    prompt = build_fim_prompt(PromptParts(prefix="p" * 100, suffix="s"), encode, SPECIAL, 54)
    assert len(prompt.ids) == 54
    assert prompt.suffix_tokens == 1 and prompt.prefix_tokens == 54 - 4 - 1


def test_extra_chunks_come_first_and_only_while_they_fit() -> None:
    parts = PromptParts(prefix="ab", suffix="", extra=[("one.py", "x"), ("two.py", "y" * 500)])
    prompt = build_fim_prompt(parts, encode, SPECIAL, 100)
    assert prompt.ids[:2] == [2, 7]
    assert decode(prompt.ids[2 : 2 + 8]) == "one.py\nx"
    assert prompt.ids.count(7) == 1
    assert prompt.truncated


def test_special_ids_need_all_three_sentinels() -> None:
    vocab = {"<fim_prefix>": 4, "<fim_suffix>": 5, "<fim_middle>": 6, "<bos>": 2}
    assert special_ids_from(vocab.get) == SpecialIds(bos=2, fim_prefix=4, fim_suffix=5, fim_middle=6, file_sep=None)
    del vocab["<fim_middle>"]
    assert special_ids_from(vocab.get) is None


def test_chat_layout_marks_the_cursor() -> None:
    text = chat_user_text(PromptParts(prefix="def f(", suffix="):\n"))
    assert "def f(<CURSOR>):" in text


def test_trim_chars_keeps_the_text_next_to_the_cursor() -> None:
    parts = trim_chars(PromptParts(prefix="a" * 10 + "B", suffix="C" + "d" * 10), 8)
    assert parts.prefix.endswith("B") and len(parts.prefix) == 6
    assert parts.suffix.startswith("C") and len(parts.suffix) == 2


class _Tokenizer:
    """A stand-in with just the surface ``layout_for`` reads (the real ones are exercised by the engine tests)."""

    def __init__(self, vocab: dict[str, int]) -> None:
        self.vocab = vocab
        self.templated: list[object] = []

    def get_vocab(self) -> dict[str, int]:
        return self.vocab

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return [100 + ord(char) for char in text]

    def apply_chat_template(self, messages: list[dict[str, str]], **_: object) -> dict[str, list[int]]:
        self.templated.append(messages)
        return {"input_ids": [9, *self.encode(messages[0]["content"]), 10]}


def test_the_layout_is_chosen_from_the_tokenizer() -> None:
    fim = layout_for(_Tokenizer({"<bos>": 2, "<fim_prefix>": 4, "<fim_suffix>": 5, "<fim_middle>": 6}))
    assert isinstance(fim, FimLayout) and fim.name == "fim"
    assert fim.ids(PromptParts(prefix="a", suffix="b"), 64) == [2, 5, 100 + ord("b"), 4, 100 + ord("a"), 6]
    tokenizer = _Tokenizer({"<bos>": 2})
    chat = layout_for(tokenizer)
    assert isinstance(chat, ChatLayout) and chat.name == "chat"
    ids = chat.ids(PromptParts(prefix="def f(", suffix=")"), 1000)
    assert ids[0] == 9 and ids[-1] == 10
    assert CURSOR_MARK in tokenizer.templated[0][0]["content"]
    assert chat.ids(PromptParts(prefix="x" * 500), 50)[-1] == 10  # a cut keeps the end, where the answer starts
