"""Fill-in-the-middle prompt formats: what an editor sends is read back into the prefix and suffix it meant."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from diffgemma_lsp.fim_formats import FORMATS, PROMPT_FORMATS, format_named, split_prompt

CODE = st.text(st.characters(blacklist_categories=["Cs"]), max_size=80)


@pytest.mark.parametrize("name", sorted(FORMATS))
@given(prefix=CODE, suffix=CODE)
def test_every_format_round_trips(name: str, prefix: str, suffix: str) -> None:
    fmt = FORMATS[name]
    if fmt.between in prefix + suffix or fmt.before in prefix + suffix:
        return  # text that itself holds the sentinels is ambiguous by construction
    prompt = fmt.build(prefix, suffix)
    assert fmt.parse(prompt) == (prefix, suffix)
    assert split_prompt(prompt, None) == (prefix, suffix)


def test_zeds_star_coder_prompt() -> None:
    prompt = "<fim_prefix>def f():\n    <fim_suffix>\nprint(f())\n<fim_middle>"
    assert split_prompt(prompt, None) == ("def f():\n    ", "\nprint(f())\n")


def test_codestral_puts_the_suffix_first() -> None:
    assert split_prompt("[SUFFIX]tail[PREFIX]head", None) == ("head", "tail")
    assert FORMATS["codestral"].build("head", "tail") == "[SUFFIX]tail[PREFIX]head"


def test_code_llama_spacing() -> None:
    assert FORMATS["code_llama"].build("a", "b") == "<PRE> a <SUF>b <MID>"
    assert split_prompt("<PRE> a <SUF>b <MID>", None) == ("a", "b")


def test_the_suffix_field_wins_over_sentinels() -> None:
    assert split_prompt("<fim_prefix>a<fim_suffix>b<fim_middle>", "tail") == (
        "<fim_prefix>a<fim_suffix>b<fim_middle>",
        "tail",
    )


def test_a_plain_prompt_is_continuation() -> None:
    assert split_prompt("import os\n", None) == ("import os\n", "")
    assert split_prompt("<fim_prefix>no middle marker", None) == ("<fim_prefix>no middle marker", "")


def test_names_and_aliases() -> None:
    assert format_named("suffix") is None
    assert format_named("code_gemma") is FORMATS["qwen"]
    assert all(name in ("suffix", "chat") or format_named(name) is not None for name in PROMPT_FORMATS)
    assert format_named("chat") is None
