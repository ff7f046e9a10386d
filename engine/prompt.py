"""Lay out an infill request as prompt token ids. Pure: takes tokenizer functions, imports no torch.

A layout is a per-checkpoint strategy (``PromptLayout``), chosen when the model loads (``layout_for``) from what
its tokenizer offers; the engine calls ``layout.ids(parts, budget)`` and never asks which one it holds. Two exist:

* ``fim``, for checkpoints whose tokenizer has the fill-in-the-middle sentinels (the shipped default model)::

      <bos> (<file_sep> name \\n text)*  <fim_suffix> SUFFIX  <fim_prefix> PREFIX  <fim_middle>

  The canvas then holds ``MIDDLE <eos> <pad>...``. The suffix comes before the prefix (SPM order) so that what
  changes while the user types, the end of the prefix, sits at the end of the prompt, and the encoded tokens
  before it can be reused from one keystroke to the next.

* ``chat``, for instruction-tuned checkpoints without FIM tokens (the released DiffusionGemma): the code
  with a cursor marker inside a user turn, answered by the model turn.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, ClassVar, Protocol

import attrs

from engine import vocab

Encode = Callable[[str], list[int]]

CURSOR_MARK = "<CURSOR>"
CHAT_INSTRUCTION = "Fill in the code at {mark}. Answer with only the missing code, no explanation and no code fence."


@attrs.frozen(kw_only=True)
class PromptParts:
    """The texts that go into a prompt."""

    prefix: str
    suffix: str = ""
    extra: Sequence[tuple[str, str]] = ()
    """(filename, text) chunks from other files."""


@attrs.frozen(kw_only=True)
class Prompt:
    """Token ids ready for the encoder, and what was cut to fit the budget."""

    ids: list[int]
    prefix_tokens: int
    suffix_tokens: int
    truncated: bool


@attrs.frozen(kw_only=True)
class SpecialIds:
    """The sentinel ids a ``fim`` layout needs."""

    bos: int | None
    fim_prefix: int
    fim_suffix: int
    fim_middle: int
    file_sep: int | None = None


def special_ids_from(token_to_id: Callable[[str], int | None]) -> SpecialIds | None:
    """The FIM sentinels of a tokenizer, or None if it has none (use the chat layout then)."""
    ids = {
        name: token_to_id(token)
        for name, token in (
            ("fim_prefix", vocab.FIM_PREFIX),
            ("fim_suffix", vocab.FIM_SUFFIX),
            ("fim_middle", vocab.FIM_MIDDLE),
        )
    }
    if any(value is None for value in ids.values()):
        return None
    return SpecialIds(bos=token_to_id(vocab.BOS), file_sep=token_to_id(vocab.FILE_SEP), **ids)


def split_budget(max_tokens: int) -> tuple[int, int]:
    """Token budgets for (suffix, prefix): the prefix matters most, the suffix gets a quarter."""
    suffix = max_tokens // 4
    return suffix, max_tokens - suffix


def build_fim_prompt(parts: PromptParts, encode: Encode, special: SpecialIds, max_tokens: int) -> Prompt:
    """The ``fim`` layout, cut to ``max_tokens``: the prefix keeps its end, the suffix its start."""
    head = [special.bos] if special.bos is not None else []
    fixed = len(head) + 3  # the three sentinels
    suffix_budget, prefix_budget = split_budget(max(max_tokens - fixed, 2))
    suffix_ids = encode(parts.suffix)
    prefix_ids = encode(parts.prefix)
    truncated = False
    if len(suffix_ids) + len(prefix_ids) > suffix_budget + prefix_budget:
        # Give the part that fits its share's spare room to the other one.
        suffix_keep = min(len(suffix_ids), max(suffix_budget, suffix_budget + prefix_budget - len(prefix_ids)))
        prefix_keep = min(len(prefix_ids), suffix_budget + prefix_budget - suffix_keep)
        truncated = suffix_keep < len(suffix_ids) or prefix_keep < len(prefix_ids)
        suffix_ids = suffix_ids[:suffix_keep]
        prefix_ids = prefix_ids[len(prefix_ids) - prefix_keep :]
    extra_ids: list[int] = []
    room = max_tokens - fixed - len(suffix_ids) - len(prefix_ids)
    if special.file_sep is not None:
        for filename, text in parts.extra:
            chunk = [special.file_sep, *encode(f"{filename}\n{text}")]
            if len(chunk) > room:
                truncated = True
                break
            extra_ids += chunk
            room -= len(chunk)
    ids = [
        *head,
        *extra_ids,
        special.fim_suffix,
        *suffix_ids,
        special.fim_prefix,
        *prefix_ids,
        special.fim_middle,
    ]
    return Prompt(ids=ids, prefix_tokens=len(prefix_ids), suffix_tokens=len(suffix_ids), truncated=truncated)


def chat_user_text(parts: PromptParts) -> str:
    """The user turn of the ``chat`` layout."""
    extra = "".join(f"File {name}:\n```\n{text}\n```\n\n" for name, text in parts.extra)
    instruction = CHAT_INSTRUCTION.format(mark=CURSOR_MARK)
    return f"{extra}{instruction}\n\n```\n{parts.prefix}{CURSOR_MARK}{parts.suffix}\n```"


class PromptLayout(Protocol):
    """How one checkpoint wants its infill prompt."""

    name: ClassVar[str]

    def ids(self, parts: PromptParts, max_tokens: int) -> list[int]:
        """Encoder input ids for ``parts``, at most ``max_tokens`` of them."""
        ...


@attrs.frozen
class FimLayout:
    """Fill-in-the-middle sentinels in SPM order (a tokenizer with FIM tokens: the shipped model)."""

    name: ClassVar[str] = "fim"
    encode: Encode
    special: SpecialIds

    def ids(self, parts: PromptParts, max_tokens: int) -> list[int]:
        return build_fim_prompt(parts, self.encode, self.special, max_tokens).ids


@attrs.frozen
class ChatLayout:
    """An instruction in the user turn of the checkpoint's chat template (the released DiffusionGemma-IT)."""

    name: ClassVar[str] = "chat"
    apply_chat_template: Callable[[list[dict[str, str]]], list[int]]

    def ids(self, parts: PromptParts, max_tokens: int) -> list[int]:
        ids = self.apply_chat_template([{"role": "user", "content": chat_user_text(parts)}])
        return ids[-max_tokens:]


def layout_for(tokenizer: Any) -> PromptLayout:
    """The layout a (transformers) tokenizer supports: FIM when it has the sentinels, else its chat template."""
    special = special_ids_from(tokenizer.get_vocab().get)
    if special is not None:
        return FimLayout(encode=lambda text: tokenizer.encode(text, add_special_tokens=False), special=special)

    def apply_chat_template(messages: list[dict[str, str]]) -> list[int]:
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        return list(ids["input_ids"] if isinstance(ids, dict) else ids)

    return ChatLayout(apply_chat_template=apply_chat_template)


def trim_chars(parts: PromptParts, max_chars: int) -> PromptParts:
    """Cut prefix and suffix to a character budget around the cursor (for layouts built from text)."""
    suffix_budget, prefix_budget = split_budget(max_chars)
    return attrs.evolve(
        parts,
        prefix=parts.prefix[-prefix_budget:] if prefix_budget else "",
        suffix=parts.suffix[:suffix_budget],
    )
