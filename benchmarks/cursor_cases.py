"""Cases for the definition at the cursor, generated mechanically from a package's code: every use of a name
imported from another module of the same package (``from .m import Name``, then ``Name``; ``from . import m`` or
``import pkg.m as m``, then ``m.Name``; ``import * as m from './m'``, then ``m.name``; named JavaScript imports; Go's
``pkg.Name`` of a package of the same module), the cursor right after the name, where the module defines the name
at its top level (a function, class, type or method-less declaration the index knows). Python's uses are read by
``ast`` (not the grammar the language server reads them with); JavaScript's and Go's by their tree-sitter grammars,
by this module's own walk of the syntax tree.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from pathlib import Path

import attrs
from tree_sitter import Node

from diffgemma_lsp import grammars
from diffgemma_lsp.grammars import language_of_path
from diffgemma_lsp.repo.index import WorkspaceIndex

JS_SUFFIXES = ("", ".ts", ".tsx", ".js", ".jsx", ".mjs", "/index.ts", "/index.js")


@attrs.frozen
class Case:
    path: Path
    line: int
    """0-based."""
    column: int
    """In characters: right after the name."""
    name: str
    """The definition's name (the code may use it under an alias)."""
    defined_in: Path
    header: str
    """The first line of the definition's header, stripped: what the context must hold, in a chunk of its file."""


def cases_of(root: Path, index: WorkspaceIndex, go_module: str = "") -> list[Case]:
    """Every case of the package at ``root`` (indexed in ``index``), in file order."""
    found: list[Case] = []
    for path in sorted(root.rglob("*")):
        language = language_of_path(path) if path.is_file() else None
        if language == "python":
            found += _python_cases(path, root)
        elif language in ("javascript", "typescript", "typescriptreact") and not path.name.endswith(".d.ts"):
            found += _js_cases(path, language, index)
        elif language == "go" and go_module and not path.name.endswith("_test.go"):
            found += _go_cases(path, root, go_module, index)
    return found


# -- Python, by ast ---------------------------------------------------------------------------------------------


def _python_file(root: Path, dotted: str) -> Path | None:
    stem = root.joinpath(*dotted.split("."))
    for candidate in (stem.with_name(stem.name + ".py"), stem / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _top_level(path: Path) -> dict[str, tuple[int, str]]:
    """The functions and classes at the top level of a Python file: name -> (line, header's first line)."""
    source = path.read_text(encoding="utf-8", errors="replace")
    lines = source.splitlines()
    found: dict[str, tuple[int, str]] = {}
    for node in ast.parse(source).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            found[node.name] = (node.lineno - 1, lines[node.lineno - 1].strip())
    return found


def _python_cases(path: Path, root: Path) -> Iterable[Case]:
    source = path.read_text(encoding="utf-8", errors="replace")
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return
    lines = source.splitlines()
    parts = list(path.relative_to(root).with_suffix("").parts)
    package = parts[:-1]
    modules: dict[str, Path] = {}  # local name -> module file
    names: dict[str, tuple[Path, str]] = {}  # local name -> (module file, its name)
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            dotted = ".".join([*base, *([node.module] if node.module else [])])
            for alias in node.names:
                local = alias.asname or alias.name
                if (module := _python_file(root, f"{dotted}.{alias.name}".strip("."))) is not None:
                    modules[local] = module
                elif dotted and (module := _python_file(root, dotted)) is not None:
                    names[local] = (module, alias.name)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname and (module := _python_file(root, alias.name)) is not None:
                    modules[alias.asname] = module
    shadowed = {node.id for node in ast.walk(tree) if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load)}
    shadowed |= {node.arg for node in ast.walk(tree) if isinstance(node, ast.arg)}  # a local of the same name
    names = {local: target for local, target in names.items() if local not in shadowed}
    tops: dict[Path, dict[str, tuple[int, str]]] = {}

    def defined(module: Path, name: str) -> tuple[int, str] | None:
        if module == path:
            return None
        if module not in tops:
            tops[module] = _top_level(module)
        return tops[module].get(name)

    for node in ast.walk(tree):
        if not isinstance(node, ast.Name | ast.Attribute) or node.lineno != node.end_lineno:
            continue
        target: tuple[Path, str] | None = None
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and node.id in names:
            target = names[node.id]
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in modules:
            target = (modules[node.value.id], node.attr)
        if target is None or (definition := defined(*target)) is None:
            continue
        line = lines[node.lineno - 1]
        column = len(line.encode("utf-8")[: node.end_col_offset].decode("utf-8", "replace"))
        yield Case(path, node.lineno - 1, column, target[1], target[0], definition[1])


# -- JavaScript / TypeScript and Go, by tree-sitter ----------------------------------------------------------------


def _walk(node: Node) -> Iterable[Node]:
    stack = [node]
    while stack:
        current = stack.pop()
        yield current
        stack.extend(reversed(current.children))


def _text(node: Node | None) -> str:
    return (node.text or b"").decode("utf-8", "replace") if node is not None else ""


def _parse(path: Path, language: str) -> tuple[Node, list[str]] | None:
    parser = grammars.parser(language)
    if parser is None:
        return None
    source = path.read_text(encoding="utf-8", errors="replace")
    return parser.parse(source.encode("utf-8")).root_node, source.splitlines()


def _column(lines: list[str], node: Node) -> int:
    row, byte = node.end_point
    return len(lines[row].encode("utf-8")[:byte].decode("utf-8", "replace"))


def _defined(index: WorkspaceIndex, files: Iterable[Path], name: str, exclude: Path) -> tuple[Path, str] | None:
    for file in files:
        if file == exclude:
            continue
        for definition in index.definitions_in(str(file)):
            if definition.name == name and not definition.parent:
                return file, definition.signature.split("\n", 1)[0].strip()
    return None


def _js_file(folder: Path, specifier: str) -> Path | None:
    stem = (folder / specifier).resolve()
    for suffix in JS_SUFFIXES:
        if Path(f"{stem}{suffix}").is_file():
            return Path(f"{stem}{suffix}")
    if stem.suffix == ".js" and (typescript := stem.with_suffix(".ts")).is_file():
        return typescript
    return None


def _js_cases(path: Path, language: str, index: WorkspaceIndex) -> Iterable[Case]:
    parsed = _parse(path, language)
    if parsed is None:
        return
    root, lines = parsed
    modules: dict[str, Path] = {}
    names: dict[str, tuple[Path, str]] = {}
    declared: set[int] = set()  # the import statements' own identifiers
    for statement in root.children:
        if statement.type != "import_statement":
            continue
        specifier = _text(statement.child_by_field_name("source"))[1:-1]
        module = _js_file(path.parent, specifier) if specifier.startswith(".") else None
        declared.update(node.id for node in _walk(statement))
        if module is None:
            continue
        for node in _walk(statement):
            if node.type == "namespace_import":
                modules[_text(node.named_children[-1])] = module
            elif node.type == "import_specifier":
                alias = node.child_by_field_name("alias")
                name = _text(node.child_by_field_name("name"))
                names[_text(alias) if alias is not None else name] = (module, name)
    for node in _walk(root):
        if node.id in declared:
            continue
        target: tuple[Path, str, Node] | None = None
        if node.type in ("identifier", "type_identifier") and _text(node) in names:
            module, name = names[_text(node)]
            target = (module, name, node)
        elif node.type in ("member_expression", "nested_type_identifier"):
            object_node = node.child_by_field_name("object") or node.child_by_field_name("module")
            member = node.child_by_field_name("property") or node.child_by_field_name("name")
            if object_node is not None and member is not None and _text(object_node) in modules:
                target = (modules[_text(object_node)], _text(member), member)
        if target is None or target[2].start_point.row != target[2].end_point.row:
            continue
        module, name, end = target
        if (definition := _defined(index, [module], name, path)) is not None:
            yield Case(path, end.start_point.row, _column(lines, end), name, definition[0], definition[1])


def _go_cases(path: Path, root: Path, go_module: str, index: WorkspaceIndex) -> Iterable[Case]:
    parsed = _parse(path, "go")
    if parsed is None:
        return
    tree, lines = parsed
    packages: dict[str, Path] = {}
    for node in _walk(tree):
        if node.type == "import_spec":
            import_path = _text(node.child_by_field_name("path"))[1:-1]
            if not import_path.startswith(go_module + "/"):
                continue
            folder = root / import_path.removeprefix(go_module + "/")
            alias = node.child_by_field_name("name")
            local = _text(alias) if alias is not None else import_path.rsplit("/", 1)[-1]
            if folder.is_dir() and local not in ("_", "."):
                packages[local] = folder
    for node in _walk(tree):
        if node.type == "selector_expression":
            operand, field = node.child_by_field_name("operand"), node.child_by_field_name("field")
        elif node.type == "qualified_type":
            operand, field = node.child_by_field_name("package"), node.child_by_field_name("name")
        else:
            continue
        if operand is None or field is None or _text(operand) not in packages:
            continue
        folder = packages[_text(operand)]
        files = sorted(file for file in folder.glob("*.go") if not file.name.endswith("_test.go"))
        if (definition := _defined(index, files, _text(field), path)) is not None:
            yield Case(path, field.start_point.row, _column(lines, field), _text(field), definition[0], definition[1])
