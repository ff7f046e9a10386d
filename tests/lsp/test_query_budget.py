"""Issue 42, finding 2: one source file froze the language server. Lua's tags query is quadratic in the nesting
depth of braces (a 150 KB file held the server for half a minute; 12,000 nested braces 3.6 s, 0.04 s now), and
post-processing asked tree-sitter for every bracket's parent, which it finds by walking from the root (quadratic in
the depth too: 20,000 nested brackets of Python took 75 s a completion, 0.5 s now). No timing here: what costs the
time is checked not to happen."""

from __future__ import annotations

import pytest

from diffgemma_lsp import grammars
from diffgemma_lsp.postprocess import syntax
from diffgemma_lsp.postprocess.languages import language_for
from diffgemma_lsp.repo import definitions
from diffgemma_lsp.repo.index import WorkspaceIndex


def nested_functions(depth: int) -> str:
    """Lua functions each defined in a table field of the one before, ``depth`` tables deep."""
    return "x = " + "{ f = function() return " * depth + "1" + " end }" * depth + "\n"


def test_the_definitions_query_starts_no_match_deeper_than_its_bound() -> None:
    """The query's cost grew with every depth it started matches at: it starts none below the bound."""
    shallow = definitions.definitions_of("function near() return 1 end\n" + nested_functions(5), "lua", "a.lua")
    assert [found.name for found in shallow][:1] == ["near"]
    deep = definitions.definitions_of(nested_functions(definitions.MAX_DEFINITION_DEPTH), "lua", "deep.lua")
    assert len(deep) < definitions.MAX_DEFINITION_DEPTH, len(deep)  # the deepest ones are not looked for


class Bracket:
    """A tree-sitter node as ``_counts`` reads it: a bracket, whose parent must not be asked for."""

    type = "("

    @property
    def parent(self) -> object:
        raise AssertionError("a bracket's parent was asked for: tree-sitter walks from the root for it")


def test_a_brackets_parent_is_never_asked_for_in_post_processing() -> None:
    parser = grammars.parser("python")
    assert parser is not None
    scan = syntax._TreeScan("f(", ")\n", language_for("python"), "python", parser)
    assert scan._counts(Bracket()) is True  # type: ignore[arg-type]


def test_a_parse_past_its_budget_is_stopped_and_the_file_left_out_of_the_index(monkeypatch: pytest.MonkeyPatch) -> None:
    """512 KB of nested brackets took 1.5-2.8 s to parse on the index's thread, all of it holding the interpreter's
    lock (no request answered meanwhile): a parse now has a budget, and yields the lock as it goes."""
    monkeypatch.setattr(definitions, "PARSE_BUDGET_S", 0.0)
    text = "".join(f"def f{number}(x):\n    return [x, {number}]\n" for number in range(5_000))
    with pytest.raises(grammars.OverBudget, match="took more than 0 s"):
        definitions.definitions_of(text, "python", "many.py")
    index = WorkspaceIndex()
    index.index_text("/work/many.py", text)
    assert "/work/many.py" not in index
    monkeypatch.setattr(definitions, "PARSE_BUDGET_S", 60.0)
    assert len(definitions.definitions_of(text, "python", "many.py")) == 5_000  # the parser works on after a stop
