"""The name at or just before the cursor, as the code reaches it: ``("helpers", "Retry")`` after
``helpers.Retry(``, ``("self", "store", "get")`` after ``self.store.get``. Read from the cursor's line alone by its
grammar's tree-sitter parser (tens of microseconds a line: this runs on every keystroke): the leaves it gives a
line with unbalanced brackets are still the line's identifiers, dots, brackets, strings and comments."""

from __future__ import annotations

import attrs
from tree_sitter import Node

from diffgemma_lsp import grammars

MAX_LINE_CHARS = 1_000
"""A longer line (minified code) is not read."""
RECEIVERS = frozenset({"this", "self", "super"})
"""Leaves that name the object a method runs on (``this`` and ``super`` are keywords in some grammars)."""
MEMBER_DOTS = frozenset({".", "?.", "::"})
OPEN = frozenset({"(", "["})
CLOSE = frozenset({")", "]"})


@attrs.frozen
class Leaf:
    kind: str
    text: str
    start: int
    """Byte offsets in the line."""
    end: int


def leaves_of(line_text: str, language_id: str) -> list[Leaf]:
    """The tokens of one line as its grammar reads them (none without a grammar); a string or comment is one leaf
    (its node), so that nothing in it looks like a name."""
    parser = grammars.parser(language_id)
    if parser is None or len(line_text) > MAX_LINE_CHARS:
        return []
    tree = parser.parse(line_text.encode("utf-8", "surrogatepass"))
    found: list[Leaf] = []
    stack: list[Node] = [tree.root_node]
    while stack:
        node = stack.pop()
        opaque = "string" in node.type or "comment" in node.type
        if node.child_count == 0 or opaque:
            text = (node.text or b"").decode("utf-8", "replace")
            found.append(Leaf("string" if opaque else node.type, text, node.start_byte, node.end_byte))
        else:
            stack.extend(reversed(node.children))
    return found


def is_name(leaf: Leaf) -> bool:
    return leaf.kind.endswith("identifier") or leaf.kind in RECEIVERS


def chains_at(line_text: str, column: int, language_id: str) -> list[tuple[str, ...]]:
    """The names the cursor (``column``, in characters, on ``line_text``) is on or just after, each as the chain of
    names that reaches it (``m.name``: ``("m", "name")``): first the name the cursor touches, then the callee of
    the innermost call or subscript whose brackets are open before the cursor on this line. Empty when there is
    neither, or the language has no grammar."""
    leaves = leaves_of(line_text, language_id)
    cursor = len(line_text[:column].encode("utf-8", "surrogatepass"))
    before = [leaf for leaf in leaves if leaf.start < cursor]
    found: list[tuple[str, ...]] = []
    if before and is_name(before[-1]) and before[-1].end >= cursor:
        found.append(_chain(before, len(before) - 1))
    depth = 0
    for at in range(len(before) - 1, -1, -1):
        kind = before[at].kind
        if kind in CLOSE:
            depth += 1
        elif kind in OPEN:
            if depth == 0:
                if at > 0 and is_name(before[at - 1]):
                    callee = _chain(before, at - 1)
                    if callee not in found:
                        found.append(callee)
                break
            depth -= 1
    return found


def _chain(leaves: list[Leaf], at: int) -> tuple[str, ...]:
    """The names joined by member dots that end at ``leaves[at]``; one that follows a call or subscript
    (``f().name``) starts with an empty name: its object is not known."""
    chain = [leaves[at].text]
    while at >= 2 and leaves[at - 1].kind in MEMBER_DOTS:
        if not is_name(leaves[at - 2]):
            chain.append("")
            break
        chain.append(leaves[at - 2].text)
        at -= 2
    return tuple(reversed(chain))
