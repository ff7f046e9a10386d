"""Editors' language names reach the post-processing as LSP's ids (issue 28): C# from Neovim (``cs``) or Helix
(``c-sharp``) gets C's rules, not the indentation fallback."""

from __future__ import annotations

import pytest

from diffgemma_lsp.document import LineDocument
from diffgemma_lsp.language_ids import EDITOR_LANGUAGE_IDS, lsp_language_id
from diffgemma_lsp.postprocess.languages import FALLBACK, JAVASCRIPT, LANGUAGES, C, language_for


@pytest.mark.parametrize(
    ("sent", "expected"),
    [
        ("cs", C),
        ("c-sharp", C),
        ("C#", C),
        ("cuda", C),
        ("objc", C),
        ("C++", C),
        ("tsx", JAVASCRIPT),
        ("jsx", JAVASCRIPT),
    ],
)
def test_an_editors_name_gets_its_languages_rules(sent: str, expected: object) -> None:
    assert language_for(sent) is FALLBACK  # as the editor names it, the fallback: what these documents got before
    assert language_for(lsp_language_id(sent)) is expected


def test_lsp_ids_pass_through_and_the_map_lands_on_lsp_ids() -> None:
    assert lsp_language_id("Python") == "python"
    assert lsp_language_id("csharp") == "csharp"
    assert lsp_language_id("cobol") == "cobol"
    assert not set(EDITOR_LANGUAGE_IDS) & set(EDITOR_LANGUAGE_IDS.values())  # one step reaches LSP's id
    assert not set(EDITOR_LANGUAGE_IDS) & set(LANGUAGES)  # nothing LSP already names is renamed


def test_an_opened_document_carries_lsp_s_id() -> None:
    assert LineDocument("file:///a.cs", "class A {}\n", 1, "cs").language_id == "csharp"
    assert LineDocument("file:///a.cu", "", 1, "cuda").language_id == "cuda-cpp"
    assert LineDocument("file:///a.py", "", 1, None).language_id is None
