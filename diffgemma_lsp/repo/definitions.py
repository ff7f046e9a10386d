"""The definitions of one file (functions, classes, methods, types, constants), found by its grammar's tags query:
each with its signature (the header up to the body), the first line of its docs, and the header of the definition
it sits in (a method's class)."""

from __future__ import annotations

from collections.abc import Iterable

import attrs
from tree_sitter import Node, QueryCursor

from diffgemma_lsp import grammars

SIGNATURE_LINES = 6
"""Lines of a header at most: a longer one is its first line."""
SIGNATURE_CHARS = 400
DOC_CHARS = 200
PARSE_BUDGET_S = 1.0
"""A file's parse for the index takes at most this long (a 450 KB Python file: 0.1 s); past it, the file's definitions
are not indexed (``grammars.OverBudget``, logged)."""
MAX_DEFINITION_DEPTH = 256
"""Definitions nested deeper in the syntax tree are not looked for: the tags query's cost grows with the depth it
starts matches at (Lua's, quadratic in the nesting of braces: 12,000 nested braces took 3.6 s, a 150 KB file minutes;
0.04 s with this bound), and no definition a user calls sits 256 nodes deep. (tree-sitter 0.26's progress callback
would stop a query on time, but stopping it crashes the process.)"""
COMMENT_TYPES = frozenset({"comment", "line_comment", "block_comment"})


@attrs.frozen(kw_only=True)
class Definition:
    """One definition of a file."""

    name: str
    kind: str
    """What the tags query calls it: function, method, class, interface, module, constant, type, macro..."""
    path: str
    line: int
    """Where its header starts (0-based), as the index orders a file's definitions."""
    signature: str
    """The header's lines as written, with their indentation (``    def get(self, key):``)."""
    doc: str = ""
    """The first line of its docs as written (a docstring's first line, or the comment above it), stripped."""
    doc_above: bool = False
    """The doc is a comment written above the header (else a docstring below it)."""
    parent: str = ""
    """The first line of the header of the definition it is in (``class Store:``), else empty."""
    parent_line: int = -1


def definitions_of(text: str, language_id: str, path: str) -> list[Definition]:
    """The definitions of ``text`` (a file in ``language_id``) in the order they appear; none where there is no
    grammar for the language."""
    query = grammars.definitions_query(language_id)
    parser = grammars.parser(language_id)
    if query is None or parser is None:
        return []
    source = text.encode("utf-8", "surrogatepass")
    tree = grammars.parse(parser, source, PARSE_BUDGET_S)
    found: dict[int, tuple[Node, Node, str]] = {}
    cursor = QueryCursor(query)
    cursor.set_max_start_depth(MAX_DEFINITION_DEPTH)
    for _, captures in cursor.matches(tree.root_node):
        names = captures.get("name", [])
        kinds = [(capture, nodes) for capture, nodes in captures.items() if capture.startswith("definition.")]
        if not names or not kinds:
            continue
        kind, nodes = kinds[0]
        node = nodes[0]
        found.setdefault(node.id, (node, names[0], kind.removeprefix("definition.")))
    definitions: list[Definition] = []
    for node, name_node, kind in sorted(found.values(), key=lambda found_one: found_one[0].start_byte):
        parent = _enclosing(node, found)
        doc, above = _doc(node)
        definitions.append(
            Definition(
                name=_text(name_node),
                kind=kind,
                path=path,
                line=node.start_point.row,
                signature=_signature(node, source),
                doc=doc,
                doc_above=above,
                parent=_signature(parent, source).split("\n", 1)[0] if parent is not None else "",
                parent_line=parent.start_point.row if parent is not None else -1,
            )
        )
    return definitions


def _text(node: Node) -> str:
    return (node.text or b"").decode("utf-8", "replace")


def _enclosing(node: Node, found: dict[int, tuple[Node, Node, str]]) -> Node | None:
    ancestor = node.parent
    while ancestor is not None:
        if ancestor.id in found:
            return ancestor
        ancestor = ancestor.parent
    return None


def _signature(node: Node, source: bytes) -> str:
    """The header as written: from the start of the definition's line (with its indentation and what precedes the
    name node there: ``int``, ``type``, ``const``) to its body (``def f(x):``, ``fn f(x) -> u8``); a definition
    without a body (a constant, a declaration) to the end of its first line. One that follows other code on its
    line (``class A { int f() {...} }``) starts at itself."""
    line_start = node.start_byte - node.start_point.column
    before = source[line_start : node.start_byte]
    start = node.start_byte if any(mark in before for mark in (b"{", b";", b"}")) else line_start
    body = node.child_by_field_name("body")
    if body is not None and body.start_point.row - node.start_point.row < SIGNATURE_LINES:
        end = body.start_byte
    else:
        line_end = source.find(b"\n", node.start_byte)
        end = min(node.end_byte, len(source) if line_end < 0 else line_end)
    return source[start:end].decode("utf-8", "replace").rstrip()[:SIGNATURE_CHARS]


def _doc(node: Node) -> tuple[str, bool]:
    """The first line of the definition's docs, and whether it is a comment above it."""
    body = node.child_by_field_name("body")
    if body is not None and body.type == "block" and body.named_child_count:  # Python: a docstring opens the body
        first = body.named_children[0]
        if (
            first.type == "expression_statement"
            and first.named_child_count
            and first.named_children[0].type == "string"
        ):
            line = _text(first).strip().split("\n", 1)[0].strip()
            quote = line[:3] if line[:3] in ('"""', "'''") else ""
            if quote and (len(line) == 3 or not line.endswith(quote)):
                line = f"{line}{quote}" if len(line) > 3 else ""
            return line[:DOC_CHARS], False
    comments = list(_comments_above(_statement_of(node)))
    if not comments:
        return "", False
    block = comments[-1]  # the farthest comment above is where a comment block starts
    return _text(block).strip().split("\n", 1)[0].strip()[:DOC_CHARS], True


def _statement_of(node: Node) -> Node:
    """The outermost node that starts on ``node``'s line and holds it (C's function, not its declarator): what a
    comment above the definition precedes."""
    while (
        node.parent is not None
        and node.parent.parent is not None
        and node.parent.start_point.row == node.start_point.row
    ):
        node = node.parent
    return node


def _comments_above(node: Node) -> Iterable[Node]:
    """The comments right above ``node`` (no blank line between), nearest first."""
    row = node.start_point.row
    sibling = node.prev_sibling
    while sibling is not None and sibling.type in COMMENT_TYPES and sibling.end_point.row >= row - 1:
        yield sibling
        row = sibling.start_point.row
        sibling = sibling.prev_sibling
