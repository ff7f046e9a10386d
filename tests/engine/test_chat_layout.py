"""The chat layout, with the release-format checkpoint's tokenizer and chat template (no stand-ins)."""

from __future__ import annotations

from pathlib import Path

import attrs
import pytest
from transformers import AutoTokenizer

from diffgemma_engine.loading.model import DEFAULT_MODEL_DIR
from diffgemma_engine.shared import protocol
from diffgemma_engine.shared.prompt import (
    CHAT_INSTRUCTION_SUFFIX_FIRST,
    CURSOR_MARK,
    IN_PLACE,
    REWRITE_INSTRUCTION,
    SELECTION_CLOSE,
    SELECTION_OPEN,
    ChatLayout,
    ChatTemplateError,
    FimLayout,
    PromptParts,
    chat_user_text,
    layout_for,
    parts_of,
)
from tests.support.release_format import CONTROL_IDS

RENDERED_HEAD = "<bos><|turn>user\n"
RENDERED_TAIL = "<turn|>\n<|turn>model\n<|channel>thought\n<channel|>"
"""The release's chat template around one user turn, thinking off (../shared/data/diffusiongemma-26B-A4B-it)."""
PARTS = PromptParts(
    prefix="def add(a, b):\n    ",
    suffix="\n\nprint(add(1, 2))\n",
    extra=[("helpers.py", "def double(x):\n    return 2 * x")],
    language="python",
)


def long_document(lines: int = 2000) -> str:
    return "".join(f"def function_{i}(value):\n    return value * {i} + offset_{i % 7}\n\n" for i in range(lines))


def test_the_rendered_prompt_is_the_release_template_token_for_token(release_tokenizer) -> None:
    layout = layout_for(release_tokenizer)
    assert isinstance(layout, ChatLayout) and layout.name is protocol.Layout.CHAT
    ids = layout.prompt(PARTS, 1024).ids
    user = chat_user_text(PARTS)
    messages = [{"role": "user", "content": user}]
    expected = release_tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=False)
    assert ids == list(expected)
    text = release_tokenizer.decode(ids, skip_special_tokens=False)
    assert text == f"{RENDERED_HEAD}{user}{RENDERED_TAIL}"
    assert ids[:2] == [CONTROL_IDS["<bos>"], CONTROL_IDS["<|turn>"]]
    assert ids.count(CONTROL_IDS["<turn|>"]) == 1
    assert ids[-1] == CONTROL_IDS["<channel|>"]  # thinking off: the empty thought channel closes the prompt


def test_the_turn_puts_other_files_first_and_the_cursor_last(release_tokenizer) -> None:
    user = chat_user_text(PARTS)
    assert user.startswith("File helpers.py:\n```python\ndef double(x):")
    assert user.index(CHAT_INSTRUCTION_SUFFIX_FIRST.format(mark=CURSOR_MARK)) < user.index("print(add(1, 2))")
    assert user.index("print(add(1, 2))") < user.index("def add(a, b):")
    assert user.endswith(f"def add(a, b):\n    {CURSOR_MARK}\n```")
    in_place = chat_user_text(PARTS, IN_PLACE)
    assert f"def add(a, b):\n    {CURSOR_MARK}\n\nprint(add(1, 2))\n" in in_place
    layout = layout_for(release_tokenizer, chat_order=IN_PLACE)
    assert release_tokenizer.decode(layout.prompt(PARTS, 1024).ids, skip_special_tokens=False).endswith(
        f"print(add(1, 2))\n\n```{RENDERED_TAIL}"
    )


def test_control_tokens_in_the_code_stay_text(release_tokenizer) -> None:
    code = 'SEPARATORS = ["<turn|>", "<eos>", "<|turn>model", "<bos>"]\n'
    layout = layout_for(release_tokenizer)
    ids = layout.prompt(PromptParts(prefix=code, suffix="# <channel|>\n"), 1024).ids
    assert ids.count(CONTROL_IDS["<turn|>"]) == 1  # the template's own
    assert ids.count(CONTROL_IDS["<|turn>"]) == 2  # user and model headers
    assert ids.count(CONTROL_IDS["<channel|>"]) == 1
    assert CONTROL_IDS["<eos>"] not in ids and ids.count(CONTROL_IDS["<bos>"]) == 1
    assert code in release_tokenizer.decode(ids, skip_special_tokens=False)


def test_control_tokens_in_the_code_stay_text_in_the_fim_layout() -> None:
    tokenizer = AutoTokenizer.from_pretrained(DEFAULT_MODEL_DIR)
    layout = layout_for(tokenizer)
    assert isinstance(layout, FimLayout)
    ids = layout.prompt(PromptParts(prefix="x = '<fim_middle><eos>'\n", suffix="y = '<fim_prefix>'\n"), 384).ids
    special = layout.special
    assert ids.count(special.fim_middle) == 1 and ids[-1] == special.fim_middle
    assert ids.count(special.fim_prefix) == 1 and ids.count(special.fim_suffix) == 1
    assert tokenizer.convert_tokens_to_ids("<eos>") not in ids


def test_a_long_prefix_keeps_bos_the_header_the_instruction_and_the_tail(release_tokenizer) -> None:
    layout = layout_for(release_tokenizer)
    prefix = long_document() + "def add(a, b):\n    return a"
    assert len(prefix) > 60_000
    prompt = layout.prompt(PromptParts(prefix=prefix, suffix=long_document(300), language="python"), 1024)
    assert prompt.truncated and len(prompt.ids) <= 1024
    text = release_tokenizer.decode(prompt.ids, skip_special_tokens=False)
    assert text.startswith(RENDERED_HEAD) and text.endswith(
        f"def add(a, b):\n    return a{CURSOR_MARK}\n```{RENDERED_TAIL}"
    )
    assert CHAT_INSTRUCTION_SUFFIX_FIRST.format(mark=CURSOR_MARK) in text
    before = text.split(f"The code before {CURSOR_MARK}:\n```python\n", 1)[1]
    assert before.startswith("def function_") or before.startswith("    return") or before.startswith("\n")
    after = text.split(f"The code after {CURSOR_MARK}:\n```python\n", 1)[1].split("\n```", 1)[0]
    assert long_document(300).startswith(after) and after.endswith("\n")  # cut at its end, on a line boundary


def test_typing_keeps_the_prompts_head(release_tokenizer) -> None:
    """Successive keystrokes share the prompt up to the cursor (what the prefix cache reuses)."""
    layout = layout_for(release_tokenizer)
    document, suffix = long_document(400), "\n" + long_document(40)
    typed = "def add(a, b):\n    total = a + b\n    return total\n"
    shared, total, previous = 0, 0, None
    for end in range(1, len(typed) + 1):
        ids = layout.prompt(PromptParts(prefix=document + typed[:end], suffix=suffix, language="python"), 1024).ids
        if previous is not None:
            common = next((i for i, (a, b) in enumerate(zip(previous, ids, strict=False)) if a != b), len(ids))
            shared += common
            total += len(ids)
        previous = ids
    assert shared / total >= 0.9


def test_a_tokenizer_without_fim_tokens_or_chat_template_is_refused(tmp_path: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(DEFAULT_MODEL_DIR)
    vocab = {token: i for token, i in tokenizer.get_vocab().items() if "fim" not in token}
    tokenizer.get_vocab = lambda: vocab  # the shipped tokenizer minus its FIM sentinels; it has no template
    with pytest.raises(ChatTemplateError, match="chat template"):
        layout_for(tokenizer)


SELECTED = "    return a - b"


def test_a_rewrite_turn_carries_the_instruction_and_the_marked_selection(release_tokenizer) -> None:
    layout = layout_for(release_tokenizer)
    parts = attrs.evolve(PARTS, prefix="def add(a, b):\n", selection=SELECTED, instruction="Fix the operator.")
    ids = layout.prompt(parts, 1024).ids
    user = chat_user_text(parts)
    expected = release_tokenizer.apply_chat_template(
        [{"role": "user", "content": user}], add_generation_prompt=True, return_dict=False
    )
    assert ids == list(expected)  # the release's template, token for token
    text = release_tokenizer.decode(ids, skip_special_tokens=False)
    assert text.startswith(f"{RENDERED_HEAD}File helpers.py:") and text.endswith(RENDERED_TAIL)
    marked = f"def add(a, b):\n{SELECTION_OPEN}{SELECTED}{SELECTION_CLOSE}\n```"
    assert text.index("Fix the operator.") < text.index("print(add(1, 2))") < text.index(marked)
    assert CURSOR_MARK not in text and "Fill in the code" not in text
    assert REWRITE_INSTRUCTION not in text  # the user's instruction replaces the default
    in_place = chat_user_text(parts, IN_PLACE)
    assert f"def add(a, b):\n{SELECTION_OPEN}{SELECTED}{SELECTION_CLOSE}\n\nprint(add(1, 2))\n" in in_place


def test_a_rewrite_without_an_instruction_asks_to_rewrite_the_selection(release_tokenizer) -> None:
    request = protocol.Infill(
        id="r",
        uri="u",
        prefix="def add(a, b):\n",
        suffix="\n",
        start=[protocol.StartSegment(text="    return "), protocol.StartSegment(text="a - b", keep=True)],
        instruction="  ",
    )
    parts = parts_of(request)
    assert (parts.selection, parts.instruction) == (SELECTED, "  ")
    text = release_tokenizer.decode(layout_for(release_tokenizer).prompt(parts, 1024).ids, skip_special_tokens=False)
    assert REWRITE_INSTRUCTION in text and f"{SELECTION_OPEN}{SELECTED}{SELECTION_CLOSE}" in text
    assert parts_of(attrs.evolve(request, start=[])).selection is None  # an insertion: the cursor's turn


def test_a_refine_keeps_the_insertions_prompt_and_only_seeds_the_canvas(release_tokenizer) -> None:
    """Refine as you type: the user typed ``z`` into the shown ``return a + b``. Its prompt is the one the
    suggestion was computed with (so the engine's prefix cache serves it again), not a rewrite of the shown text."""
    from diffgemma_lsp.refine import Divergence, refine_request

    layout = layout_for(release_tokenizer)
    offered = protocol.Infill(id="c", uri="u", prefix="def add(a, b):\n    ", suffix="\n", language_id="python")
    typed = attrs.evolve(offered, prefix=offered.prefix + "z")
    refine = refine_request(typed, Divergence(offset=len(offered.prefix), typed="z", seed="eturn a + b"), 1)
    assert refine.start and refine.refine
    assert layout.prompt(parts_of(refine), 1024).ids == layout.prompt(parts_of(offered), 1024).ids
    as_rewrite = release_tokenizer.decode(
        layout.prompt(parts_of(attrs.evolve(refine, refine=False)), 1024).ids, skip_special_tokens=False
    )
    assert SELECTION_OPEN in as_rewrite  # the same start without the mark: a selection to rewrite


def test_a_long_document_keeps_the_selection_and_the_instruction_whole(release_tokenizer) -> None:
    parts = PromptParts(
        prefix=long_document() + "def add(a, b):\n",
        suffix=long_document(300),
        language="python",
        selection=SELECTED,
        instruction="Fix the operator.",
    )
    prompt = layout_for(release_tokenizer).prompt(parts, 1024)
    assert prompt.truncated and len(prompt.ids) <= 1024
    text = release_tokenizer.decode(prompt.ids, skip_special_tokens=False)
    assert "Fix the operator." in text
    assert text.endswith(f"def add(a, b):\n{SELECTION_OPEN}{SELECTED}{SELECTION_CLOSE}\n```{RENDERED_TAIL}")
