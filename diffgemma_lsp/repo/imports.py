"""The files a source file imports and the names it takes from them, where the language lets a path be resolved
from the import alone: Python's modules and packages (relative or from a workspace folder, ``src/`` too) and
JavaScript's and TypeScript's relative specifiers."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from pathlib import PurePosixPath

import attrs

_PY_FROM = re.compile(r"^[ \t]*from[ \t]+(\.*[\w.]*)[ \t]+import[ \t]+(\([^)]*\)|[^\n#]*)", re.MULTILINE)
_PY_IMPORT = re.compile(
    r"^[ \t]*import[ \t]+([\w.]+(?:[ \t]+as[ \t]+\w+)?(?:[ \t]*,[ \t]*[\w.]+(?:[ \t]+as[ \t]+\w+)?)*)", re.MULTILINE
)
_JS_FROM = re.compile(r"""\bimport\s+(?:type\s+)?([^'";]*?)\s*from\s*['"](\.{1,2}/[^'"]+)['"]""")
_JS_REQUIRE = re.compile(r"""(?:const|let|var)\s+([^=;]+?)\s*=\s*require\(\s*['"](\.{1,2}/[^'"]+)['"]\s*\)""")
_NAME = re.compile(r"[A-Za-z_$][\w$]*")
_JS_SUFFIXES = ("", ".ts", ".tsx", ".js", ".jsx", ".mjs", ".cjs", "/index.ts", "/index.tsx", "/index.js")
JS_LANGUAGES = frozenset({"javascript", "javascriptreact", "typescript", "typescriptreact"})


@attrs.frozen
class Imported:
    """One file an import names, and the names taken from it (none: the module itself, ``import pkg.mod``)."""

    path: str
    names: tuple[str, ...]


def import_statements(text: str, language_id: str) -> tuple[str, ...]:
    """The import statements of ``text``, as written, in order: what :func:`imports_of` reads (and a cache key for
    it). Found from each occurrence of ``import`` (``require``), not by a pattern tried at every line: this runs on
    every keystroke."""
    found: list[str] = []
    if language_id == "python":
        starts = dict.fromkeys(text.rfind("\n", 0, at) + 1 for at in _occurrences(text, "import"))
        for start in starts:
            match = _PY_FROM.match(text, start) or _PY_IMPORT.match(text, start)
            if match is not None:
                found.append(match.group(0))
    elif language_id in JS_LANGUAGES:
        for at in _occurrences(text, "import"):
            if (match := _JS_FROM.match(text, at)) is not None:
                found.append(match.group(0))
        for at in _occurrences(text, "require"):
            start = text.rfind("\n", 0, at) + 1
            if (match := _JS_REQUIRE.search(text, start, at + 300)) is not None:
                found.append(match.group(0))
    elif language_id == "go":  # ``import "path"`` or ``import (...)`` at the start of a line
        for at in _occurrences(text, "import"):
            if at and text[at - 1] != "\n":
                continue
            end = _end_of(text, "\n", at)
            if text[at + len("import") : end].lstrip().startswith("("):
                end = _end_of(text, ")", at) + 1
            found.append(text[at:end])
    return tuple(found)


def _end_of(text: str, mark: str, start: int) -> int:
    """Where the next ``mark`` after ``start`` is, else the end of ``text``."""
    at = text.find(mark, start)
    return len(text) if at < 0 else at


def _occurrences(text: str, word: str) -> list[int]:
    found = []
    at = text.find(word)
    while at >= 0:
        found.append(at)
        at = text.find(word, at + len(word))
    return found


def imports_of(
    text: str, language_id: str, path: str, roots: Sequence[str], exists: Callable[[str], bool]
) -> list[Imported]:
    """The imports of ``text`` (the file at ``path``) that resolve to a file ``exists`` knows, in their order."""
    if language_id == "python":
        return _python_imports(text, path, roots, exists)
    if language_id in JS_LANGUAGES:
        return _js_imports(text, path, exists)
    return []


def _python_imports(text: str, path: str, roots: Sequence[str], exists: Callable[[str], bool]) -> list[Imported]:
    found: list[Imported] = []
    for match in _PY_FROM.finditer(text):
        module, names_text = match.group(1), match.group(2)
        names = tuple(
            part.split(" as ")[0].strip()
            for part in names_text.strip("()").replace("\n", " ").split(",")
            if part.strip()
        )
        names = tuple(name for name in names if _NAME.fullmatch(name))
        dotted, bases = _python_search(module, path, roots)
        for base in bases:
            target = python_module_in(base, dotted, exists)
            if target is None:
                continue
            modules = [
                Imported(sub, ())
                for name in names
                if (sub := python_module_in(base, f"{dotted}.{name}".strip("."), exists))
            ]
            found.append(Imported(target, names))
            found.extend(modules)  # ``from pkg import mod``: the module's file too
            break
    for match in _PY_IMPORT.finditer(text):
        for module in match.group(1).split(","):
            target = python_module(module.split(" as ")[0].strip(), path, roots, exists)
            if target is not None:
                found.append(Imported(target, ()))
    return found


def _python_search(module: str, path: str, roots: Sequence[str]) -> tuple[str, list[PurePosixPath]]:
    """``module`` (``..pkg.mod``, ``pkg.mod``) imported from ``path``: its dotted name without the leading dots,
    and the folders it is looked for in, in order (a relative one: the one its dots name)."""
    dots = len(module) - len(module.lstrip("."))
    if not dots:
        return module, _python_bases(path, roots)
    here = PurePosixPath(path).parent
    if dots - 2 >= len(here.parents):
        return module[dots:], []  # more dots than folders: nowhere
    return module[dots:], [here.parents[dots - 2] if dots > 1 else here]


def python_module(module: str, path: str, roots: Sequence[str], exists: Callable[[str], bool]) -> str | None:
    """The file of ``module`` (``..pkg.mod``, ``pkg.mod``) imported from ``path``, where ``exists`` knows one."""
    dotted, bases = _python_search(module, path, roots)
    for base in bases:
        if (target := python_module_in(base, dotted, exists)) is not None:
            return target
    return None


def _python_bases(path: str, roots: Sequence[str]) -> list[PurePosixPath]:
    """Where an absolute import may start: each workspace folder, its ``src/``, and the file's own ancestors (a
    script beside its package)."""
    bases = [PurePosixPath(root) for root in roots] + [PurePosixPath(root) / "src" for root in roots]
    bases += list(PurePosixPath(path).parents)[:4]
    return bases


def python_module_in(base: PurePosixPath, dotted: str, exists: Callable[[str], bool]) -> str | None:
    """The file of the module ``dotted`` under the folder ``base`` (``a.b``: ``a/b.py``, ``.pyi``, or the package
    ``a/b/__init__.py``; empty: ``base``'s own ``__init__.py``), where ``exists`` knows one."""
    if not dotted:
        candidate = str(base / "__init__.py")
        return candidate if exists(candidate) else None
    stem = base.joinpath(*dotted.split("."))
    for candidate in (f"{stem}.py", f"{stem}.pyi", str(stem / "__init__.py")):
        if exists(candidate):
            return candidate
    return None


def _js_imports(text: str, path: str, exists: Callable[[str], bool]) -> list[Imported]:
    found: list[Imported] = []
    here = PurePosixPath(path).parent
    for pattern in (_JS_FROM, _JS_REQUIRE):
        for match in pattern.finditer(text):
            clause, specifier = match.group(1), match.group(2)
            names = tuple(
                part.split(" as ")[0].split(":")[0].strip()
                for part in clause.replace("{", ",").replace("}", ",").split(",")
                if part.strip() and not part.strip().startswith("*")
            )
            target = js_module(here, specifier, exists)
            if target is not None:
                found.append(Imported(target, tuple(name for name in names if _NAME.fullmatch(name))))
    return found


def js_module(here: PurePosixPath, specifier: str, exists: Callable[[str], bool]) -> str | None:
    """The file a relative ``specifier`` names from the folder ``here``, where ``exists`` knows one."""
    parts: list[str] = list(here.parts)
    for part in specifier.split("/"):
        if part == "..":
            parts = parts[:-1]
        elif part not in ("", "."):
            parts.append(part)
    stem = str(PurePosixPath(*parts))
    for suffix in _JS_SUFFIXES:
        if exists(stem + suffix):
            return stem + suffix
    if stem.endswith(".js"):  # TypeScript imports its own files as ``./x.js``
        for suffix in (".ts", ".tsx"):
            if exists(stem[:-3] + suffix):
                return stem[:-3] + suffix
    return None
