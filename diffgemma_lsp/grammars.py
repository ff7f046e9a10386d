"""The tree-sitter grammars, by LSP language id and by file extension.

Each grammar is a wheel on PyPI (``tree-sitter-python`` and friends) installed with the language server, loaded on
first use; none is ever downloaded at run time. The definitions come from each grammar's own ``tags.scm`` (the
queries GitHub's code navigation runs), its ``@definition.*`` patterns only.
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import threading
import time
from pathlib import PurePath

import attrs
from tree_sitter import Language, Parser, Query, Tree


@attrs.frozen
class Grammar:
    """Where a language's grammar lives."""

    module: str
    """The grammar wheel's module."""
    extensions: tuple[str, ...]
    function: str = "language"
    """The module's function that gives the language."""
    distribution: str = ""
    """The wheel, where its tags query is a file of the distribution rather than the module's ``TAGS_QUERY``."""
    extends: str = ""
    """A module whose tags query this language's extends (TypeScript's holds only what JavaScript's lacks)."""


_JS_EXTENSIONS = (".js", ".mjs", ".cjs", ".jsx")
GRAMMARS: dict[str, Grammar] = {
    "python": Grammar("tree_sitter_python", (".py", ".pyi")),
    "javascript": Grammar("tree_sitter_javascript", _JS_EXTENSIONS),
    "javascriptreact": Grammar("tree_sitter_javascript", ()),
    "typescript": Grammar(
        "tree_sitter_typescript", (".ts", ".mts", ".cts"), "language_typescript", extends="tree_sitter_javascript"
    ),
    "typescriptreact": Grammar("tree_sitter_typescript", (".tsx",), "language_tsx", extends="tree_sitter_javascript"),
    "go": Grammar("tree_sitter_go", (".go",)),
    "rust": Grammar("tree_sitter_rust", (".rs",)),
    "c": Grammar("tree_sitter_c", (".c", ".h")),
    "cpp": Grammar("tree_sitter_cpp", (".cc", ".cpp", ".cxx", ".hh", ".hpp", ".hxx")),
    "java": Grammar("tree_sitter_java", (".java",)),
    "csharp": Grammar("tree_sitter_c_sharp", (".cs",), distribution="tree-sitter-c-sharp"),
    "ruby": Grammar("tree_sitter_ruby", (".rb",)),
    "lua": Grammar("tree_sitter_lua", (".lua",)),
}
"""LSP language id -> its grammar (``diffgemma_lsp.language_ids`` maps the editors' own names onto these ids)."""

LANGUAGE_OF_EXTENSION = {
    extension: language for language, grammar in GRAMMARS.items() for extension in grammar.extensions
}


def language_of_path(path: str | PurePath) -> str | None:
    """The language id of a file, from its extension; None for a file no grammar reads."""
    return LANGUAGE_OF_EXTENSION.get(PurePath(path).suffix.lower())


@functools.cache
def language(language_id: str) -> Language | None:
    """The tree-sitter language of ``language_id``; None where there is no grammar for it."""
    grammar = GRAMMARS.get(language_id)
    if grammar is None:
        return None
    module = importlib.import_module(grammar.module)
    return Language(getattr(module, grammar.function)())


def _tags_source(grammar: Grammar) -> str:
    if grammar.distribution:
        files = importlib.metadata.files(grammar.distribution) or []
        tags = next(path for path in files if path.name == "tags.scm")
        own = tags.read_text()
    else:
        own = str(importlib.import_module(grammar.module).TAGS_QUERY)
    base = str(importlib.import_module(grammar.extends).TAGS_QUERY) if grammar.extends else ""
    return f"{base}\n{own}"


@functools.cache
def definitions_query(language_id: str) -> Query | None:
    """The grammar's tags query with only its definition patterns enabled (references are not indexed)."""
    grammar = GRAMMARS.get(language_id)
    found = language(language_id)
    if grammar is None or found is None:
        return None
    source = _tags_source(grammar)
    query = Query(found, source)
    encoded = source.encode()
    for index in range(query.pattern_count):
        pattern = encoded[query.start_byte_for_pattern(index) : query.end_byte_for_pattern(index)]
        if b"@definition." not in pattern:
            query.disable_pattern(index)
    return query


READ_CHUNK = 64 * 1024
"""Bytes the parser is handed at a time."""


class OverBudget(Exception):
    """A parse ran past its time budget and was stopped."""


def parse(parser: Parser, source: bytes, budget_s: float) -> Tree:
    """``source`` parsed within ``budget_s`` seconds, else ``OverBudget``. The parser reads the text through a
    callback and reports its progress to another, every few hundred bytes: there the interpreter may switch threads,
    so a parse on a worker thread no longer holds the event loop up for its whole length (512 KB of nested brackets
    took 1.5-2.8 s, all of it with the interpreter's lock held), and a parse past its budget stops."""
    deadline = time.perf_counter() + budget_s

    def read(byte: int, _point: tuple[int, int]) -> bytes:
        return source[byte : byte + READ_CHUNK]

    def past_budget(_offset: int, _has_error: bool) -> bool:
        return time.perf_counter() > deadline

    try:
        return parser.parse(read, progress_callback=past_budget)
    except ValueError:  # tree-sitter's "Parsing failed": stopped by the callback
        parser.reset()
        raise OverBudget(f"parsing {len(source)} bytes took more than {budget_s:g} s: stopped") from None


_parsers = threading.local()


def parser(language_id: str) -> Parser | None:
    """A parser for ``language_id``, one per thread (a parser is not safe to share between threads)."""
    cache: dict[str, Parser] = _parsers.__dict__.setdefault("by_language", {})
    if language_id not in cache:
        found = language(language_id)
        if found is None:
            return None
        cache[language_id] = Parser(found)
    return cache[language_id]
