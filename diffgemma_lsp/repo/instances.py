"""The classes of the local names above the cursor, where the code says them: ``r = helpers.Retry(3)``,
``store: Store``, a parameter ``x: Foo`` (Python); ``const r = new m.Retry()``, ``x: Foo`` (TypeScript);
``r := &Retry{}``, ``var s config.Store``, a parameter ``x *Foo`` (Go). Read by the grammar's tree-sitter parser
from the lines of the function the cursor is in (at most ``MAX_LINES`` above it), the last one saying it winning."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from tree_sitter import Node

from diffgemma_lsp import grammars

MAX_LINES = 80
TYPE_WRAPPERS = frozenset({"type", "type_annotation", "pointer_type", "unary_expression"})
"""Nodes around a type that say nothing about which class it is (a Go ``&T{}`` or ``*T``, Python's ``type``)."""
CLASS_IN_JS_METHOD = "class _ {\n"
"""Put before a JavaScript method's lines: alone, the method's header does not parse."""


def instance_types(
    lines: Sequence[str], start: int, line: int, language_id: str, in_method: bool = False
) -> dict[str, tuple[str, ...]]:
    """Local name -> the chain of names of its class (``("helpers", "Retry")``), from ``lines[start:line]``
    (``start``: where the function the cursor is in starts, ``in_method``: a method of a class)."""
    parser = grammars.parser(language_id)
    first = max(start, line - MAX_LINES, 0)
    if parser is None or first >= line:
        return {}
    text = "".join(lines[first:line])
    if in_method and language_id != "python":
        text = CLASS_IN_JS_METHOD + text
    tree = parser.parse(text.encode("utf-8", "surrogatepass"))
    found: dict[str, tuple[str, ...]] = {}
    for name, kind in _declared(tree.root_node):
        chain = _chain(kind)
        if name is not None and name.type == "identifier" and chain:
            found[_text(name)] = chain
    return found


def _declared(root: Node) -> Iterable[tuple[Node | None, Node | None]]:
    """(the name, the node that says its class), in order."""
    stack = [root]
    while stack:
        node = stack.pop()
        stack.extend(reversed(node.children))
        kind = node.type
        if kind == "typed_parameter":  # Python ``x: Foo`` (the name is its first child)
            yield (node.named_children[0] if node.named_children else None), node.child_by_field_name("type")
        elif kind in ("typed_default_parameter", "parameter_declaration", "var_spec"):
            yield node.child_by_field_name("name"), node.child_by_field_name("type")
        elif kind in ("required_parameter", "optional_parameter"):
            yield node.child_by_field_name("pattern"), node.child_by_field_name("type")
        elif kind == "assignment":
            typed = node.child_by_field_name("type")
            yield node.child_by_field_name("left"), typed or _called(node.child_by_field_name("right"))
        elif kind == "variable_declarator":
            typed = node.child_by_field_name("type")
            value = node.child_by_field_name("value")
            made = None
            if value is not None and value.type == "new_expression":
                made = value.child_by_field_name("constructor")
            yield node.child_by_field_name("name"), typed or made
        elif kind == "short_var_declaration":
            left, right = node.child_by_field_name("left"), node.child_by_field_name("right")
            if left is not None and right is not None and left.named_children and right.named_children:
                yield left.named_children[0], _literal_type(right.named_children[0])


def _called(value: Node | None) -> Node | None:
    """What a Python assignment's value calls (``Retry(3)``: ``Retry``), taken for a class."""
    return value.child_by_field_name("function") if value is not None and value.type == "call" else None


def _literal_type(value: Node) -> Node | None:
    """A Go composite literal's type (``&Retry{}``, ``config.Store{}``)."""
    while value.type == "unary_expression" and value.child_by_field_name("operand") is not None:
        value = value.child_by_field_name("operand")  # type: ignore[assignment]
    return value.child_by_field_name("type") if value.type == "composite_literal" else None


def _chain(kind: Node | None) -> tuple[str, ...]:
    while kind is not None and kind.type in TYPE_WRAPPERS and kind.named_children:
        kind = kind.named_children[0]
    if kind is None:
        return ()
    parts = tuple(_text(kind).split("."))
    return parts if all(part.isidentifier() for part in parts) else ()


def _text(node: Node) -> str:
    return (node.text or b"").decode("utf-8", "replace")
