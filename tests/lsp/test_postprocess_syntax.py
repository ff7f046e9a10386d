"""The document around the cursor read with tree-sitter (postprocess/syntax.py), against the scanner alone."""

from __future__ import annotations

import pytest

from diffgemma_lsp import grammars
from diffgemma_lsp.postprocess import syntax
from diffgemma_lsp.postprocess.languages import language_for, pair_tokens, scan
from diffgemma_lsp.postprocess.syntax import LINE_COMMENT, DocumentScan, scan_document


def read(before: str, after: str, language_id: str) -> DocumentScan:
    return scan_document(before, after, language_for(language_id), language_id)


def stack(document: DocumentScan) -> list[str]:
    return [token.kind for token in pair_tokens(document.before)[0]]


def test_a_java_text_block_is_one_string_where_the_scanner_reads_code_in_it() -> None:
    before = 'class A {\n  String s = """\n    {"open": [\n    """;\n  void f() {\n    '
    after = "\n  }\n}\n"
    tokens, starts, _ = scan(before, language_for("java"))
    assert [token.kind for token in pair_tokens(tokens)[0]] == ["{", "{", "[", "{"]  # the scanner's misreading
    document = read(before, after, "java")
    assert stack(document) == ["{", "{"]
    assert [number for number, start in enumerate(document.starts) if start is not None] == [2, 3]
    assert document.state is None
    assert [token.kind for token in pair_tokens(document.after)[1]] == ["{", "{"]


def test_a_comment_closed_after_the_cursor_holds_the_cursor() -> None:
    document = read("int f() {\n  /* the ", " reason */\n  return 1;\n}\n", "c")
    assert document.state == ("*/", True, False)
    assert stack(document) == ["{"]


def test_the_scanner_reads_an_unterminated_string_the_parser_cannot() -> None:
    """An error-free subtree inside an error is not trusted while the scanner is in a string: the quoted "x" and
    the code after it are the docstring's text, not a string and code."""
    before = 'def f():\n    """Starts a docstring "x" (\n    def'
    document = read(before, "", "python")
    tokens, starts, state = scan(before, language_for("python"))
    assert document.state == state == ('"""', True, True)
    assert stack(document) == []
    assert document.starts == tuple(starts)


def test_a_line_comment_at_the_cursor_holds_it_to_the_end_of_its_line() -> None:
    assert read("x = 1  # why (", "\ny = 2\n", "python").state == LINE_COMMENT
    assert read("x = 1  # why (\n", "y = 2\n", "python").state is None


def test_columns_count_characters_not_bytes() -> None:
    document = read('s = "é€😀"; call(a, ', "b)\n", "javascript")
    (opener,) = pair_tokens(document.before)[0]
    assert (opener.line, opener.column) == (0, len('s = "é€😀"; call'))
    (closer,) = document.after
    assert (closer.line, closer.column, closer.opens) == (0, 1, False)


def test_ruby_blocks_come_from_the_tree_modifiers_and_endless_methods_open_none() -> None:
    before = "class A\n  def n = 1\n  def f(x)\n    return 1 if x\n    while x do\n      y\n    end\n    "
    document = read(before, "\n  end\nend\n", "ruby")
    assert stack(document) == ["end", "end"]
    assert len(pair_tokens(document.after)[1]) == 2


def test_a_language_without_a_grammar_is_scanned() -> None:
    assert grammars.parser("yaml") is None
    document = read("a: [1,\n  ", "2]\n", "yaml")
    tokens, starts, state = scan("a: [1,\n  ", language_for("yaml"))
    assert document == DocumentScan(
        before=tuple(tokens), starts=tuple(starts), state=state, after=tuple(scan("2]\n", language_for("yaml"))[0])
    )


def test_a_grammar_that_fails_leaves_the_document_to_the_scanner(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(self: object) -> DocumentScan:
        raise RuntimeError("a grammar bug")

    monkeypatch.setattr(syntax._TreeScan, "result", broken)
    before = "def f(x):\n    return g("
    document = read(before, ")\n", "python")
    tokens, starts, state = scan(before, language_for("python"))
    assert document.before == tuple(tokens) and document.state == state
    assert stack(document) == ["("]
