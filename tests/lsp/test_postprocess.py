"""Golden cases for post-processing (tests/data/golden/*.toml) and unit tests of its filters."""

from __future__ import annotations

import tomllib
from collections import Counter
from pathlib import Path

import pytest

from diffgemma_lsp.postprocess import Edit, postprocess
from diffgemma_lsp.postprocess.cursor import make_cursor, normalise
from diffgemma_lsp.postprocess.languages import FALLBACK, LUA, PYTHON, RUST, code_of, language_for, scan
from diffgemma_lsp.postprocess.pipeline import trim_whitespace

GOLDEN = Path(__file__).resolve().parents[1] / "data" / "golden"
CURSOR = "├┤"
COMPLAINTS = {"suffix", "bracket", "indent", "scope", "midline", "crlf"}
LANGUAGES = {"python", "javascript", "go", "rust", "c", "lua", "typescript", "java", "cpp", "csharp", "ruby"}


def load_cases() -> list[dict[str, object]]:
    cases = []
    for path in sorted(GOLDEN.glob("*.toml")):
        table = tomllib.loads(path.read_text(encoding="utf-8"))
        for case in table["case"]:
            case.setdefault("language", table.get("language", "plaintext"))
            cases.append({"file": path.stem, **case})
    return cases


CASES = load_cases()


def split(source: str) -> tuple[str, str]:
    assert source.count(CURSOR) == 1, "a golden source needs exactly one cursor marker"
    prefix, suffix = source.split(CURSOR)
    return prefix, suffix


@pytest.mark.parametrize("case", CASES, ids=[f"{case['file']}: {case['name']}" for case in CASES])
def test_golden(case: dict[str, object]) -> None:
    source, expected = str(case["source"]), str(case["expected"])
    if case.get("crlf"):
        source, expected = source.replace("\n", "\r\n"), expected.replace("\n", "\r\n")
    prefix, suffix = split(source)
    edit = postprocess(
        prefix, suffix, str(case["raw"]), str(case["language"]), instruct=bool(case.get("instruct", False))
    )
    if not expected:
        assert edit is None
    else:
        assert edit == Edit(text=expected, replace_to_eol=bool(case.get("replace_to_eol", False)))


def test_golden_table_covers_languages_and_complaints() -> None:
    assert len(CASES) >= 60
    per_file = Counter(str(case["file"]) for case in CASES)
    assert LANGUAGES <= set(per_file)
    assert COMPLAINTS <= {str(case["complaint"]) for case in CASES}
    for language in LANGUAGES:
        covered = {str(case["complaint"]) for case in CASES if case["file"] == language}
        assert {"suffix", "midline", "crlf"} & covered, language


def test_normalise_turns_crlf_and_cr_into_lf() -> None:
    assert normalise("a\r\nb\rc\n") == "a\nb\nc\n"


def test_crlf_output_for_a_crlf_document() -> None:
    edit = postprocess("def f():\r\n", "\r\n", "\n    return 1\n    return 2", "python")
    assert edit is not None
    assert "\n" not in edit.text.replace("\r\n", "")


def test_unknown_language_id_falls_back_to_indentation() -> None:
    assert language_for("cobol") is FALLBACK
    assert language_for("Python") is PYTHON


def test_scanner_skips_strings_comments_and_char_literals() -> None:
    tokens, _, state = scan('f("(", \'[\')  # {\nx = """\n)\n"""', PYTHON)
    assert [(token.kind, token.opens) for token in tokens] == [("(", True), ("(", False)]
    assert state is None


def test_scanner_keeps_state_across_lines_and_at_the_end() -> None:
    _, starts, state = scan('s = """doc\n(more', PYTHON)
    assert starts[1] is not None and state is not None
    _, _, in_comment = scan("x = 1  # note (", PYTHON)
    assert in_comment is not None


def test_rust_lifetimes_and_raw_strings() -> None:
    tokens, _, _ = scan("fn f<'a>(x: &'a str) { let s = r#\"}\"#; let c = '}'; }", RUST)
    assert [token.kind for token in tokens] == ["(", "(", "{", "{"]


def test_lua_block_keywords_and_long_brackets() -> None:
    tokens, _, _ = scan("--[==[ end ]==]\nlocal function f() if x then return [[end]] end end", LUA)
    assert [(token.kind, token.opens) for token in tokens] == [
        ("end", True),
        ("(", True),
        ("(", False),
        ("end", True),
        ("end", False),
        ("end", False),
    ]


def test_code_of_drops_a_trailing_comment() -> None:
    assert code_of("if x:  # why:", PYTHON) == "if x:  "
    assert code_of("s = '#'", PYTHON) == "s = '#'"


def test_cursor_knows_what_the_suffix_closes() -> None:
    cursor = make_cursor("f(g(", "), 1)\n", "", "python")
    assert [token.kind for token in cursor.stack] == ["(", "("]
    assert cursor.suffix_closers == ("(", "(")
    assert (cursor.line_before, cursor.rest) == ("f(g(", "), 1)")


def test_document_indentation_style_is_detected() -> None:
    spaces = make_cursor("a:\n  b:\n    c\n", "", "", "yaml")
    assert (spaces.tabs, spaces.unit) == (False, 2)
    tabs = make_cursor("{\n\tx\n", "", "", "c")
    assert tabs.tabs is True


def test_trim_whitespace_keeps_what_the_rest_of_the_line_needs() -> None:
    assert trim_whitespace("x,  ", make_cursor("f(", "y)", "", "python")) == "x,  "
    assert trim_whitespace("a  \n\n", make_cursor("", "", "", "python")) == "a"
    assert trim_whitespace("\n  a();\n\n\n", make_cursor("{", "}", "", "c")) == "\n  a();\n"
