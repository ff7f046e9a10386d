"""The definitions a chain of names written in a file reaches (``helpers.Retry``, ``self.store.get``, ``pkg.Name``),
resolved through the file's import bindings and the workspace index as the language resolves them: a module's
top-level names (a Python package's submodules too), a class's methods, ``self``/``this`` as the class the cursor is
in, a local name as its class where the code says it (``instances``), a Go package's names in the folder its import
path ends with, then the names the file defines and its star imports; a name none of these reach is looked up by
itself when few files define it at the top level."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import PurePosixPath

import attrs

from diffgemma_lsp.repo.bindings import DEFAULT, EVERYTHING, Binding
from diffgemma_lsp.repo.cursor_names import leaves_of
from diffgemma_lsp.repo.definitions import Definition
from diffgemma_lsp.repo.imports import JS_LANGUAGES, js_module, python_module, python_module_in
from diffgemma_lsp.repo.index import WorkspaceIndex

MAX_FILES_PER_NAME = 3
"""A name defined at the top level of more files than this (``get``, ``run``) is too common to guess which one is
meant, unless the file imports it from one of them."""
CLASS_KINDS = frozenset({"class", "interface", "type", "struct", "trait", "module"})
CONSTRUCTORS = frozenset({"__init__", "constructor", "new", "initialize"})
"""A class's member shown with it: what calling the class runs."""
RECEIVERS = frozenset({"self", "cls", "this"})


@attrs.frozen
class Module:
    """A file, as what a name of it reaches."""

    path: str


@attrs.frozen
class GoPackage:
    import_path: str


Target = Module | GoPackage | Definition


@attrs.frozen(kw_only=True)
class Scope:
    """What a chain's first name can be, in the file at ``path``, at ``line``."""

    index: WorkspaceIndex
    path: str
    language_id: str
    line: int
    bindings: dict[str, Binding]
    star_sources: tuple[str, ...] = ()
    roots: tuple[str, ...] = ()
    instances: dict[str, tuple[str, ...]] = attrs.Factory(dict)
    """Local name -> the chain that names its class (``instances.instance_types``)."""


def scope_of(
    index: WorkspaceIndex,
    path: str,
    language_id: str,
    line: int,
    bindings: Sequence[Binding],
    instances: dict[str, tuple[str, ...]] | None = None,
) -> Scope:
    return Scope(
        instances=instances or {},
        index=index,
        path=path,
        language_id=language_id,
        line=line,
        bindings={binding.local: binding for binding in bindings if binding.local != EVERYTHING},
        star_sources=tuple(binding.source for binding in bindings if binding.local == EVERYTHING),
        roots=tuple(str(root) for root in index.roots),
    )


def resolve(chain: Sequence[str], scope: Scope) -> list[Definition]:
    """The definitions ``chain`` reaches (a definition on the cursor's own line, the one being written, excluded)."""
    definitions = [target for target in _targets(chain, scope) if isinstance(target, Definition)]
    return [d for d in definitions if not (d.path == scope.path and d.line == scope.line)]


def _targets(chain: Sequence[str], scope: Scope, instance: bool = False) -> list[Target]:
    targets = _first(chain[0], scope, instance) if chain and chain[0] else []
    for name in chain[1:]:
        targets = [found for target in targets for found in _member(target, name, scope)]
    return targets


def constructors_of(definition: Definition, index: WorkspaceIndex) -> list[Definition]:
    """A class's ``__init__`` (``constructor``...), shown with it."""
    if definition.kind not in CLASS_KINDS:
        return []
    return [member for member in members_of(definition, index) if member.name in CONSTRUCTORS]


def members_of(definition: Definition, index: WorkspaceIndex) -> list[Definition]:
    """A class's methods, as the file nests them."""
    return [
        member
        for member in index.definitions_in(definition.path)
        if member.parent_line == definition.line and member != definition
    ]


def member_named(definition: Definition, name: str, index: WorkspaceIndex) -> list[Definition]:
    """A class's method ``name`` (a Go type's: a method of its package whose receiver is the type)."""
    if definition.path.endswith(".go"):
        folder = PurePosixPath(definition.path).parent
        return [
            method
            for method in index.definitions_named(name)
            if method.kind == "method"
            and PurePosixPath(method.path).parent == folder
            and go_receiver_type(method.signature) == definition.name
        ]
    return [member for member in members_of(definition, index) if member.name == name]


def _in_go_folder(name: str, scope: Scope) -> list[Target]:
    folder = PurePosixPath(scope.path).parent
    return [d for d in scope.index.definitions_named(name) if not d.parent and PurePosixPath(d.path).parent == folder]


def go_receiver_type(signature: str) -> str:
    """The type a Go method's header names as its receiver (``func (s *Server) Handle()``: ``Server``)."""
    leaves = leaves_of(signature, "go")
    return next((leaf.text for leaf in leaves if leaf.kind == "type_identifier"), "")


def _is_class(target: Target) -> bool:
    return isinstance(target, Definition) and target.kind in CLASS_KINDS


def _first(name: str, scope: Scope, instance: bool = False) -> list[Target]:
    """What ``name`` is at the start of a chain (``instance``: the chain says a local name's class)."""
    index = scope.index
    if name in RECEIVERS:
        enclosing = enclosing_class(index.definitions_in(scope.path), scope.line)
        return [enclosing] if enclosing is not None else []
    if (kind := scope.instances.get(name)) is not None and not instance:
        return [found for found in _targets(kind, scope, instance=True) if _is_class(found)]
    binding = scope.bindings.get(name)
    if binding is not None:
        return _bound(binding, scope)
    own = [d for d in index.definitions_in(scope.path) if d.name == name and not d.parent]
    if own:
        return list(own)
    if scope.language_id == "go":  # the package's other files
        return _in_go_folder(name, scope)
    for source in scope.star_sources:
        module = _module_file(source, scope)
        if module is not None and (found := _member(Module(module), name, scope)):
            return found
    return list(by_name_alone(name, index))


def _bound(binding: Binding, scope: Scope) -> list[Target]:
    if scope.language_id == "go":
        return [GoPackage(binding.source)]
    if binding.member is None:
        module = _module_file(binding.source, scope)
        return [Module(module)] if module is not None else []
    if scope.language_id == "python":  # ``from pkg import mod``: the submodule, if there is one
        joined = binding.source + ("" if binding.source.endswith(".") else ".") + binding.member
        submodule = _module_file(joined, scope)
        if submodule is not None:
            return [Module(submodule)]
    module = _module_file(binding.source, scope)
    if module is None:
        return []
    member = binding.local if binding.member == DEFAULT else binding.member
    return _member(Module(module), member, scope) or list(by_name_alone(member, scope.index))


def _module_file(source: str, scope: Scope) -> str | None:
    exists = scope.index.__contains__
    if scope.language_id == "python":
        return python_module(source, scope.path, scope.roots, exists)
    if scope.language_id in JS_LANGUAGES and source.startswith("."):
        return js_module(PurePosixPath(scope.path).parent, source, exists)
    return None


def _member(target: Target, name: str, scope: Scope) -> list[Target]:
    index = scope.index
    if isinstance(target, GoPackage):
        return list(_in_go_package(name, target.import_path, index))
    if isinstance(target, Module):
        found: list[Target] = [d for d in index.definitions_in(target.path) if d.name == name and not d.parent]
        if not found and scope.language_id == "python":
            package = PurePosixPath(target.path)
            if package.name == "__init__.py":
                submodule = python_module_in(package.parent, name, index.__contains__)
                if submodule is not None:
                    return [Module(submodule)]
        return found
    if target.kind in CLASS_KINDS:
        return list(member_named(target, name, index))
    return []


def _in_go_package(name: str, import_path: str, index: WorkspaceIndex) -> list[Definition]:
    """The top-level definitions of ``name`` in the folder whose path ends with most of ``import_path``'s last
    elements (a checkout's folder holds the module's packages under any prefix)."""
    wanted = import_path.strip("/").split("/")
    best: list[Definition] = []
    best_match = 0
    for definition in index.definitions_named(name):
        if definition.parent or definition.path.endswith("_test.go"):
            continue
        folder = PurePosixPath(definition.path).parent.parts
        match = 0
        while match < min(len(wanted), len(folder)) and folder[-1 - match] == wanted[-1 - match]:
            match += 1
        if match > best_match:
            best, best_match = [definition], match
        elif match == best_match and match:
            best.append(definition)
    return best


def by_name_alone(name: str, index: WorkspaceIndex, exclude_path: str = "") -> list[Definition]:
    """The top-level definitions of ``name`` (outside ``exclude_path``) when at most ``MAX_FILES_PER_NAME`` files
    have one: a name no import reaches, looked up by itself."""
    found = [d for d in index.definitions_named(name) if not d.parent and d.path != exclude_path]
    return found if 0 < len({definition.path for definition in found}) <= MAX_FILES_PER_NAME else []


def enclosing_class(definitions: Sequence[Definition], line: int) -> Definition | None:
    """The class the code at ``line`` is in, by the file's definitions (in order): the one that holds the last
    definition starting at or before ``line``, else that definition if it is a class."""
    by_line = {definition.line: definition for definition in definitions}
    before = [definition for definition in definitions if definition.line <= line]
    current = before[-1] if before else None
    while current is not None and current.kind not in CLASS_KINDS:
        current = by_line.get(current.parent_line) if current.parent else None
    return current
