"""Lay out an infill request as prompt token ids. Pure: takes tokenizer functions, imports no torch.

A layout is a per-checkpoint strategy (``PromptLayout``), chosen when the model loads (``layout_for``) from what
its tokenizer offers; the engine calls ``layout.prompt(parts, budget)`` and never asks which one it holds. Two
exist:

* ``fim``, for checkpoints whose tokenizer has the fill-in-the-middle sentinels (the shipped default model)::

      <bos> (<file_sep> name \\n text)*  <fim_suffix> SUFFIX  <fim_prefix> PREFIX  <fim_middle>

  The canvas then holds ``MIDDLE <eos> <pad>...``. The suffix comes before the prefix (SPM order) so that what
  changes while the user types, the end of the prefix, sits at the end of the prompt, and the encoded tokens
  before it can be reused from one keystroke to the next.

* ``chat``, for instruction-tuned checkpoints without FIM tokens (the released DiffusionGemma): one user turn
  of the checkpoint's own chat template (rendered once, at load) holding other files, an instruction and the
  code, then the model turn with thinking off (the template's empty thought channel)::

      <bos><|turn>user\\n  (File name: ```text```)*  INSTRUCTION
      The code after <CURSOR>: ```SUFFIX```  The code before <CURSOR>: ```PREFIX<CURSOR>```
      <turn|>\\n<|turn>model\\n<|channel>thought\\n<channel|>

  ``suffix_first`` (the default) keeps what changes while typing next to the template's tail; ``in_place``
  shows one block ``PREFIX<CURSOR>SUFFIX`` instead (a checkpoint hint, ``chat_order``).

  A rewrite (``PromptParts.selection``) asks instead to rewrite the code marked ``<SELECTION>...</SELECTION>``
  where the cursor would be, with the user's instruction (``REWRITE_INSTRUCTION`` without one). The ``fim`` layout
  has no place for either: its prompt is the insertion's, and the selection starts the canvas
  (``diffgemma_engine.request.infill``). A refine (``Infill.refine``: the user typed into a shown suggestion) is
  laid out as the insertion it refines in both layouts: its start only seeds the canvas.

Both layouts budget the code, not the rendered ids: the fixed parts always survive, and prefix and suffix are cut
on line boundaries that stay put while the user types (``diffgemma_engine.shared.budget``). Text from the user is
encoded as text: a ``<turn|>`` or ``<eos>`` written in the code never becomes that control token.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any, ClassVar, Protocol

import attrs

from . import budget, protocol, template_render, vocab

Encode = Callable[[str], list[int]]
"""Text to token ids, special tokens written in the text encoded as text."""

CURSOR_MARK = "<CURSOR>"
SUFFIX_FIRST = "suffix_first"
IN_PLACE = "in_place"
CHAT_ORDERS = (SUFFIX_FIRST, IN_PLACE)
CHAT_INSTRUCTION = (
    "Fill in the code at {mark}. Answer with only the code that goes there: no explanation, no code fence, "
    "and none of the code around it."
)
CHAT_INSTRUCTION_SUFFIX_FIRST = (
    "Fill in the code at {mark}. The file is shown in two parts: first the code after {mark}, then the code "
    "before it. Answer with only the code that goes at {mark}: no explanation, no code fence, and none of the "
    "code around it."
)
SELECTION_OPEN = "<SELECTION>"
SELECTION_CLOSE = "</SELECTION>"
REWRITE_INSTRUCTION = "Rewrite the selected code."
"""A rewrite's instruction when the user gave none."""
CHAT_REWRITE_RULES = (
    "The selected code is marked with {open} and {close}. Answer with only the code that replaces it: no "
    "explanation, no code fence, no markers, and none of the code around it."
)
CHAT_REWRITE_RULES_SUFFIX_FIRST = (
    CHAT_REWRITE_RULES + " The file is shown in two parts: first the code after the selection, then the code "
    "before it, ending with the selection."
)


@attrs.frozen(kw_only=True)
class PromptParts:
    """The texts that go into a prompt."""

    prefix: str
    suffix: str = ""
    extra: Sequence[tuple[str, str]] = ()
    """(filename, text) chunks from other files."""
    language: str = ""
    """The document's language id (``python``), for the chat layout's code fences; may be empty."""
    selection: str | None = None
    """A rewrite: the text between prefix and suffix that the answer replaces. None: an insertion at the cursor."""
    instruction: str = ""
    """A rewrite's instruction from the user (the chat layout's; empty: ``REWRITE_INSTRUCTION``)."""


def parts_of(request: protocol.Infill) -> PromptParts:
    """The texts of an ``Infill`` request (the engine's layouts and the remote backend's chat turn read them)."""
    return PromptParts(
        prefix=request.prefix,
        suffix=request.suffix,
        extra=[(chunk.filename, chunk.text) for chunk in request.extra],
        language=request.language_id,
        selection=None if request.refine or not request.start else "".join(segment.text for segment in request.start),
        instruction=request.instruction,
    )


@attrs.frozen(kw_only=True)
class Prompt:
    """Token ids ready for the encoder, and what was cut to fit the budget."""

    ids: list[int]
    prefix_tokens: int
    suffix_tokens: int
    truncated: bool
    code_chars: int = 0
    """Characters of prefix and suffix kept (with the tokens: the tokenizer's characters per token of code)."""


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
    fim_prefix, fim_suffix, fim_middle = map(token_to_id, (vocab.FIM_PREFIX, vocab.FIM_SUFFIX, vocab.FIM_MIDDLE))
    if fim_prefix is None or fim_suffix is None or fim_middle is None:
        return None
    return SpecialIds(
        bos=token_to_id(vocab.BOS),
        fim_prefix=fim_prefix,
        fim_suffix=fim_suffix,
        fim_middle=fim_middle,
        file_sep=token_to_id(vocab.FILE_SEP),
    )


def _counter(encode: Encode) -> budget.Count:
    """Token counts of texts, remembered: the blocks before the cursor are the same from keystroke to keystroke."""
    return functools.lru_cache(maxsize=4096)(lambda text: len(encode(text)))


def _within(ids: list[int], max_tokens: int, keep_head: int, keep_tail: int) -> list[int]:
    """``ids`` cut to ``max_tokens`` after the first ``keep_head`` and before the last ``keep_tail`` ids.

    Blocks counted apart can encode a token or two longer together, at their seams; this takes that off.
    """
    excess = len(ids) - max_tokens
    if excess <= 0:
        return ids
    keep_head = max(0, min(keep_head, max_tokens - keep_tail))
    return ids[:keep_head] + ids[keep_head + excess :]


def build_fim_prompt(
    parts: PromptParts, encode: Encode, special: SpecialIds, max_tokens: int, count: budget.Count | None = None
) -> Prompt:
    """The ``fim`` layout within ``max_tokens``: other files first (up to a quarter of the budget, whole chunks in
    order, each that fits in what the ones before it left: the last, the definitions at the cursor, are small and
    the most needed), then suffix and prefix cut on stable line boundaries, the suffix keeping its start, the prefix
    its end."""
    head = [special.bos] if special.bos is not None else []
    extra_ids: list[int] = []
    extra_cut = bool(parts.extra) and special.file_sep is None
    if special.file_sep is not None:
        room = max_tokens // 4
        for filename, text in parts.extra:
            chunk = [special.file_sep, *encode(f"{filename}\n{text}")]
            if len(extra_ids) + len(chunk) > room:  # left out; a later, smaller one may still fit
                extra_cut = True
                continue
            extra_ids += chunk
    fixed = len(head) + len(extra_ids) + 3  # the three sentinels
    count = count or _counter(encode)
    cut = budget.fit(parts.prefix, parts.suffix, max(max_tokens - fixed, 0), count)
    suffix_ids, prefix_ids = encode(cut.suffix), encode(cut.prefix)
    ids = [*head, *extra_ids, special.fim_suffix, *suffix_ids, special.fim_prefix, *prefix_ids, special.fim_middle]
    ids = _within(ids, max_tokens, keep_head=len(ids) - len(prefix_ids) - 1, keep_tail=1)
    return Prompt(
        ids=ids,
        prefix_tokens=len(prefix_ids),
        suffix_tokens=len(suffix_ids),
        truncated=cut.truncated or extra_cut,
        code_chars=len(cut.prefix) + len(cut.suffix),
    )


EDITS_CHUNK_NAME = "recent edits"
"""The extra chunk that holds the user's recent edits as a unified diff (``diffgemma_lsp.edit_history``), after
the chunks of other files: the ``fim`` layout labels it so after its file separator, the ``chat`` layout shows it
as a diff."""


def chat_file_block(name: str, text: str, language: str = "") -> str:
    """One other file (or the recent edits) in the ``chat`` layout's user turn."""
    if name == EDITS_CHUNK_NAME:
        return f"The user's recent edits:\n```diff\n{text}\n```\n\n"
    return f"File {name}:\n```{language}\n{text}\n```\n\n"


def chat_user_text(parts: PromptParts, order: str = SUFFIX_FIRST) -> str:
    """The user turn of the ``chat`` layout: other files, the instruction, then the code (see the module doc)."""
    fence = f"```{parts.language}\n"
    extra = "".join(chat_file_block(name, text, parts.language) for name, text in parts.extra)
    if parts.selection is not None:
        return _chat_rewrite_text(parts, order, extra, fence)
    if order == IN_PLACE:
        instruction = CHAT_INSTRUCTION.format(mark=CURSOR_MARK)
        return f"{extra}{instruction}\n\n{fence}{parts.prefix}{CURSOR_MARK}{parts.suffix}\n```"
    instruction = CHAT_INSTRUCTION_SUFFIX_FIRST.format(mark=CURSOR_MARK)
    return (
        f"{extra}{instruction}\n\nThe code after {CURSOR_MARK}:\n{fence}{parts.suffix}\n```\n\n"
        f"The code before {CURSOR_MARK}:\n{fence}{parts.prefix}{CURSOR_MARK}\n```"
    )


def _chat_rewrite_text(parts: PromptParts, order: str, extra: str, fence: str) -> str:
    """``chat_user_text`` for a rewrite: other files, the user's instruction and the rules of the answer, then the
    code with the selection between ``SELECTION_OPEN`` and ``SELECTION_CLOSE``."""
    marked = f"{SELECTION_OPEN}{parts.selection}{SELECTION_CLOSE}"
    instruction = parts.instruction.strip() or REWRITE_INSTRUCTION
    if order == IN_PLACE:
        rules = CHAT_REWRITE_RULES.format(open=SELECTION_OPEN, close=SELECTION_CLOSE)
        return f"{extra}{instruction}\n\n{rules}\n\n{fence}{parts.prefix}{marked}{parts.suffix}\n```"
    rules = CHAT_REWRITE_RULES_SUFFIX_FIRST.format(open=SELECTION_OPEN, close=SELECTION_CLOSE)
    return (
        f"{extra}{instruction}\n\n{rules}\n\nThe code after the selection:\n{fence}{parts.suffix}\n```\n\n"
        f"The code before the selection, then the selection:\n{fence}{parts.prefix}{marked}\n```"
    )


@attrs.frozen
class ChatTemplate:
    """A checkpoint's chat template around one user turn, as ids: ``head`` (``<bos><|turn>user\\n``) and ``tail``
    (``<turn|>\\n<|turn>model\\n``, then, with thinking off, the empty thought channel)."""

    head: tuple[int, ...]
    tail: tuple[int, ...]


def build_chat_prompt(
    parts: PromptParts,
    encode: Encode,
    template: ChatTemplate,
    max_tokens: int,
    order: str = SUFFIX_FIRST,
    count: budget.Count | None = None,
) -> Prompt:
    """The ``chat`` layout within ``max_tokens``, budgeted on the code, not on the rendered ids.

    The template's head (``<bos>``, the turn header), the instruction (a rewrite's selection and instruction too)
    and the template's tail (the generation prompt) are always whole; other files come first and take up to a
    quarter of the budget, whole files in order, each that fits in what the ones before it left; prefix and suffix
    share the rest, cut on line boundaries that stay put while the user types.
    ``count`` (tokens of a text) may remember its answers across calls: pass the layout's.
    """
    count = count or _counter(encode)
    frame = len(template.head) + len(template.tail)
    bare = attrs.evolve(parts, prefix="", suffix="", extra=())
    room = max(max_tokens - frame - count(chat_user_text(bare, order)), 0) // 4
    extra: list[tuple[str, str]] = []
    for name, text in parts.extra:
        size = count(chat_file_block(name, text, parts.language))
        if size > room:  # left out; a later, smaller one may still fit
            continue
        extra.append((name, text))
        room -= size
    scaffold = attrs.evolve(bare, extra=extra)
    code_budget = max(max_tokens - frame - count(chat_user_text(scaffold, order)), 0)
    cut = budget.fit(parts.prefix, parts.suffix, code_budget, count)
    user = encode(chat_user_text(attrs.evolve(scaffold, prefix=cut.prefix, suffix=cut.suffix), order))
    ids = _within([*template.head, *user, *template.tail], max_tokens, len(template.head), len(template.tail))
    return Prompt(
        ids=ids,
        prefix_tokens=count(cut.prefix),
        suffix_tokens=count(cut.suffix),
        truncated=cut.truncated or len(extra) < len(parts.extra),
        code_chars=len(cut.prefix) + len(cut.suffix),
    )


class PromptLayout(Protocol):
    """How one checkpoint wants its infill prompt."""

    name: ClassVar[protocol.Layout]

    def prompt(self, parts: PromptParts, max_tokens: int) -> Prompt:
        """Encoder input for ``parts``, at most ``max_tokens`` ids."""
        ...


@attrs.frozen
class FimLayout:
    """Fill-in-the-middle sentinels in SPM order (a tokenizer with FIM tokens: the shipped model)."""

    name: ClassVar[protocol.Layout] = protocol.Layout.FIM
    encode: Encode
    special: SpecialIds
    count: budget.Count = attrs.field(init=False, eq=False, repr=False)
    """Token counts of blocks of lines, remembered from one keystroke to the next."""

    @count.default
    def _count(self) -> budget.Count:
        return _counter(self.encode)

    def prompt(self, parts: PromptParts, max_tokens: int) -> Prompt:
        return build_fim_prompt(parts, self.encode, self.special, max_tokens, self.count)


@attrs.frozen
class ChatLayout:
    """An instruction in one user turn of the checkpoint's chat template (the released DiffusionGemma-IT)."""

    name: ClassVar[protocol.Layout] = protocol.Layout.CHAT
    encode: Encode
    template: ChatTemplate
    order: str = attrs.field(default=SUFFIX_FIRST, validator=attrs.validators.in_(CHAT_ORDERS))
    count: budget.Count = attrs.field(init=False, eq=False, repr=False)
    """Token counts of blocks of lines, remembered from one keystroke to the next."""

    @count.default
    def _count(self) -> budget.Count:
        return _counter(self.encode)

    def prompt(self, parts: PromptParts, max_tokens: int) -> Prompt:
        return build_chat_prompt(parts, self.encode, self.template, max_tokens, self.order, self.count)


USER_SLOT = "\ue000diffgemma-user-turn\ue001"
"""Stands for the user's content when the chat template is rendered once, to find the text around it."""


class ChatTemplateError(ValueError):
    """A chat template the ``chat`` layout cannot use."""


def chat_template_of(tokenizer: Any) -> ChatTemplate:
    """The ids the tokenizer's chat template puts around one user turn, with the generation prompt and thinking
    off, rendered with limits (``diffgemma_engine.shared.template_render``: the template is the model folder's code).
    The template's own text is encoded with its control tokens; the user's text goes in between as text."""
    try:
        template = tokenizer.get_chat_template()
    except ValueError as exc:  # transformers: "Cannot use chat template functions because ... not set"
        raise ChatTemplateError(f"the tokenizer has neither FIM tokens nor a usable chat template: {exc}") from None
    variables = {**tokenizer.special_tokens_map, "enable_thinking": False}  # as apply_chat_template passes them
    rendered = template_render.render_turn(template, variables, USER_SLOT)
    head, found, tail = rendered.partition(USER_SLOT)
    if not found:
        raise ChatTemplateError("the chat template does not show the user's message")
    return ChatTemplate(
        head=tuple(tokenizer.encode(head, add_special_tokens=False)),
        tail=tuple(tokenizer.encode(tail, add_special_tokens=False)),
    )


def text_encoder(tokenizer: Any) -> Encode:
    """Encode user text as text: no BOS added, and special tokens written in it split into ordinary tokens."""
    return lambda text: tokenizer.encode(text, add_special_tokens=False, split_special_tokens=True)


def layout_for(tokenizer: Any, chat_order: str = SUFFIX_FIRST) -> PromptLayout:
    """The layout a (transformers) tokenizer supports: FIM when it has the sentinels, else its chat template."""
    special = special_ids_from(tokenizer.get_vocab().get)
    if special is not None:
        return FimLayout(encode=text_encoder(tokenizer), special=special)
    return ChatLayout(encode=text_encoder(tokenizer), template=chat_template_of(tokenizer), order=chat_order)


def char_budget_cut(parts: PromptParts, max_chars: int) -> PromptParts:
    """Prefix and suffix cut to a character budget on the same stable line boundaries as the token budget: the
    engine's first, cheap cut of a long document, before it counts tokens."""
    cut = budget.fit(parts.prefix, parts.suffix, max_chars, len, per_line=budget.CHARS_PER_LINE)
    return attrs.evolve(parts, prefix=cut.prefix, suffix=cut.suffix)
