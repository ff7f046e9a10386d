"""The names a file's imports bind, read by the grammar's tree-sitter parser from its import statements (as
``imports.import_statements`` finds them): ``from . import helpers`` binds ``helpers`` to the module ``.helpers``
or to the name ``helpers`` of ``.``; ``import * as m from './m'`` binds ``m`` to ``./m``; Go's
``import cfg "example.com/app/config"`` binds ``cfg`` to that package."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import attrs
from tree_sitter import Node

from diffgemma_lsp import grammars
from diffgemma_lsp.repo.imports import JS_LANGUAGES

EVERYTHING = "*"
"""The local name of a star import (``from .names import *``): every name of the module."""
DEFAULT = "default"
"""The member a JavaScript default import takes."""


@attrs.frozen
class Binding:
    """A local name an import binds."""

    local: str
    source: str
    """The module as the import names it: ``..pkg.mod`` (Python), ``./m`` (JavaScript), an import path (Go)."""
    member: str | None
    """The name taken from the module, or None: the local name is the module itself."""


def bindings_of(statements: Sequence[str], language_id: str) -> list[Binding]:
    """The bindings of ``statements`` (a file's imports, as written), in order; none where the language has no
    grammar or these rules."""
    parser = grammars.parser(language_id)
    if parser is None or not statements:
        return []
    tree = parser.parse("\n".join(statements).encode("utf-8", "surrogatepass"))
    if language_id == "python":
        return list(_python(tree.root_node))
    if language_id in JS_LANGUAGES:
        return list(_javascript(tree.root_node))
    if language_id == "go":
        return list(_go(tree.root_node))
    return []


def _text(node: Node | None) -> str:
    return (node.text or b"").decode("utf-8", "replace") if node is not None else ""


def _python(root: Node) -> Iterable[Binding]:
    for statement in root.children:
        if statement.type == "import_statement":  # ``import a.b`` binds ``a``; ``import a.b as m`` binds ``m``
            for name in statement.children_by_field_name("name"):
                if name.type == "aliased_import":
                    yield Binding(
                        _text(name.child_by_field_name("alias")), _text(name.child_by_field_name("name")), None
                    )
                else:
                    yield Binding(_text(name).split(".")[0], _text(name).split(".")[0], None)
        elif statement.type == "import_from_statement":
            module = _text(statement.child_by_field_name("module_name"))
            if any(child.type == "wildcard_import" for child in statement.children):
                yield Binding(EVERYTHING, module, EVERYTHING)
            for name in statement.children_by_field_name("name"):
                if name.type == "aliased_import":
                    member = _text(name.child_by_field_name("name"))
                    yield Binding(_text(name.child_by_field_name("alias")), module, member)
                else:
                    yield Binding(_text(name), module, _text(name))


def _javascript(root: Node) -> Iterable[Binding]:
    for statement in root.children:
        if statement.type == "import_statement":
            source = _string(statement.child_by_field_name("source"))
            for clause in statement.children:
                if clause.type == "import_clause":
                    yield from _js_clause(clause, source)
        elif statement.type in ("lexical_declaration", "variable_declaration"):  # ``const m = require('./m')``
            for declarator in statement.named_children:
                value = declarator.child_by_field_name("value")
                arguments = value.child_by_field_name("arguments") if value is not None else None
                if value is None or value.type != "call_expression" or arguments is None:
                    continue
                if _text(value.child_by_field_name("function")) != "require" or not arguments.named_children:
                    continue
                source = _string(arguments.named_children[0])
                yield from _js_pattern(declarator.child_by_field_name("name"), source)


def _js_clause(clause: Node, source: str) -> Iterable[Binding]:
    for part in clause.named_children:
        if part.type == "identifier":
            yield Binding(_text(part), source, DEFAULT)
        elif part.type == "namespace_import":
            yield Binding(_text(part.named_children[-1]), source, None)
        elif part.type == "named_imports":
            for specifier in part.named_children:
                if specifier.type != "import_specifier":
                    continue
                name = _text(specifier.child_by_field_name("name"))
                alias = specifier.child_by_field_name("alias")
                yield Binding(_text(alias) if alias is not None else name, source, name)


def _js_pattern(pattern: Node | None, source: str) -> Iterable[Binding]:
    if pattern is None:
        return
    if pattern.type == "identifier":
        yield Binding(_text(pattern), source, None)
    elif pattern.type == "object_pattern":
        for part in pattern.named_children:
            if part.type == "shorthand_property_identifier_pattern":
                yield Binding(_text(part), source, _text(part))
            elif part.type == "pair_pattern":
                yield Binding(_text(part.child_by_field_name("value")), source, _text(part.child_by_field_name("key")))


def _string(node: Node | None) -> str:
    """A string literal's text without its quotes."""
    return _text(node)[1:-1] if node is not None else ""


def _go(root: Node) -> Iterable[Binding]:
    stack = list(root.children)
    while stack:
        node = stack.pop(0)
        if node.type == "import_spec":
            path = _string(node.child_by_field_name("path"))
            name = node.child_by_field_name("name")
            local = _text(name) if name is not None else go_package_name(path)
            if local not in ("_", "."):
                yield Binding(local, path, None)
        else:
            stack[:0] = node.children


def go_package_name(path: str) -> str:
    """The name a Go import path's package is used by, as its last element says (``yaml.v3``: ``yaml``; a major
    version's ``/v2``: the element before it)."""
    parts = path.split("/")
    last = parts[-1]
    if len(parts) > 1 and last.startswith("v") and last[1:].isdigit():
        last = parts[-2]
    return last.split(".")[0].replace("-", "_")
