"""What a prompt takes from the workspace index for a cursor: the definitions of the names the code there uses
(the identifiers near the cursor first, then what the file imports), then windows of other files like the lines
before the cursor; cut to a budget and put in a stable order (by path, then line), so that the prompt's head stays
put while the user types on one line.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import attrs

from diffgemma_lsp.repo.definitions import Definition
from diffgemma_lsp.repo.imports import Imported, import_statements, imports_of
from diffgemma_lsp.repo.index import WorkspaceIndex
from diffgemma_lsp.repo.snippets import WINDOW_LINES, Snippet, tokens_of

LINES_BEFORE = 8
"""Lines above the cursor whose identifiers are "near" it (Zed's Zeta looks a few lines around the cursor)."""
LINES_AFTER = 2
MAX_FILES_PER_NAME = 3
"""A name defined in more files than this (``get``, ``run``) is too common to guess which one is meant, unless the
file imports it from one of them."""
MEMBERS_PER_CLASS = 12
"""Methods shown under a class whose name is used."""
SNIPPETS = 2
DEFINITION_SHARE = 0.75
"""Of the budget, what the definitions may take before the snippets get theirs (they take what is left)."""
DEFINITION = "definition"
SNIPPET = "snippet"
RECENT_FILE = "recent file"
RECENT_EDIT = "recent edit"
"""The origins of a chunk (the last two are the ring buffer's and the edit history's, not the index's)."""
_IDENTIFIER = re.compile(r"[A-Za-z_$][\w$]*")


@attrs.frozen
class ContextChunk:
    """A piece of context for the prompt, with where it comes from."""

    origin: str
    """``definition``, ``snippet``, ``recent file`` or ``recent edit``."""
    path: str
    """The file, as the prompt names it (relative to its workspace folder)."""
    text: str


def identifiers_near(lines: Sequence[str], line: int) -> list[str]:
    """The identifiers on and around ``line``, nearest line first (the cursor's, then one above, one below...),
    each once."""
    order = [line]
    for distance in range(1, LINES_BEFORE + 1):
        order.append(line - distance)
        if distance <= LINES_AFTER:
            order.append(line + distance)
    seen: dict[str, None] = {}
    for number in order:
        if 0 <= number < len(lines):
            seen.update(dict.fromkeys(_IDENTIFIER.findall(lines[number])))
    return list(seen)


class RepoContext:
    """The chunks the index gives a cursor. What costs most and changes least (resolving the imports, ranking the
    windows) is cached until the index or its inputs change: while the user types on one line, only the names near
    the cursor are read again."""

    def __init__(self, index: WorkspaceIndex) -> None:
        self.index = index
        self._imports: dict[str, tuple[tuple[str, ...], int, list[Imported]]] = {}
        self._snippets: dict[str, tuple[frozenset[str], int, list[tuple[Snippet, list[str]]]]] = {}

    def forget(self, path: str) -> None:
        self._imports.pop(path, None)
        self._snippets.pop(path, None)

    def chunks(self, path: str, text: str, language_id: str, line: int, budget_chars: int) -> list[ContextChunk]:
        """The chunks for a cursor on ``line`` of ``text`` (the file at ``path``), within ``budget_chars``:
        definitions (by path), then snippets (by path)."""
        if budget_chars <= 0:
            return []
        index = self.index
        lines = text.splitlines()
        ranked = _ranked_definitions(index, path, lines, line, self._imported(path, text, language_id))
        chosen, used = _within(ranked, int(budget_chars * DEFINITION_SHARE))
        chunks = [
            ContextChunk(origin=DEFINITION, path=index.relative(file), text=render(definitions))
            for file, definitions in sorted(chosen.items())
        ]
        snippets: list[ContextChunk] = []
        room = budget_chars - used
        for snippet, window in self._similar(path, lines[max(line - WINDOW_LINES, 0) : line]):
            body = "".join(f"{text}\n" for text in window)
            if len(body) <= room:
                snippets.append(ContextChunk(origin=SNIPPET, path=index.relative(snippet.path), text=body))
                room -= len(body)
        return chunks + sorted(snippets, key=lambda chunk: chunk.path)

    def _imported(self, path: str, text: str, language_id: str) -> list[Imported]:
        statements = import_statements(text, language_id)
        cached = self._imports.get(path)
        if cached is not None and cached[0] == statements and cached[1] == self.index.files_version:
            return cached[2]
        roots = [str(root) for root in self.index.roots]
        found = imports_of("\n".join(statements), language_id, path, roots, self.index.__contains__)
        self._imports[path] = (statements, self.index.files_version, found)
        return found

    def _similar(self, path: str, before: Sequence[str]) -> list[tuple[Snippet, list[str]]]:
        query = tokens_of(before)
        cached = self._snippets.get(path)
        if cached is not None and cached[0] == query and cached[1] == self.index.version:
            return cached[2]
        found = self.index.similar(query, path, SNIPPETS)
        self._snippets[path] = (query, self.index.version, found)
        return found


def _ranked_definitions(
    index: WorkspaceIndex, path: str, lines: Sequence[str], line: int, imported: list[Imported]
) -> list[Definition]:
    """The definitions worth showing, best first: of the names near the cursor, then of the imported names."""
    local = {definition.name for definition in index.definitions_in(path)}
    imported_files = {entry.path for entry in imported}
    names = [name for name in identifiers_near(lines, line) if name not in local]
    names += [name for entry in imported for name in entry.names if name not in local]
    ranked: dict[tuple[str, int], Definition] = {}
    for name in dict.fromkeys(names):
        found = [definition for definition in index.definitions_named(name) if definition.path != path]
        preferred = [definition for definition in found if definition.path in imported_files]
        if not preferred:  # a name the file does not import: only what another file can reach (no nested helper)
            found = [definition for definition in found if not definition.parent]
            if len({definition.path for definition in found}) > MAX_FILES_PER_NAME:
                continue
        for definition in preferred or found:
            ranked.setdefault((definition.path, definition.line), definition)
            if definition.kind in ("class", "interface"):
                members = [
                    member for member in index.definitions_in(definition.path) if member.parent_line == definition.line
                ]
                for member in members[:MEMBERS_PER_CLASS]:
                    ranked.setdefault((member.path, member.line), member)
    return list(ranked.values())


def _within(ranked: list[Definition], budget: int) -> tuple[dict[str, list[Definition]], int]:
    """The best of ``ranked`` whose rendering fits ``budget`` characters, by file, and the characters used."""
    chosen: dict[str, list[Definition]] = {}
    sizes: dict[str, int] = {}
    used = 0
    for definition in ranked:
        trial = [*chosen.get(definition.path, []), definition]
        size = len(render(trial))
        if used - sizes.get(definition.path, 0) + size > budget:
            continue
        used += size - sizes.get(definition.path, 0)
        chosen[definition.path], sizes[definition.path] = trial, size
    return chosen, used


def render(definitions: Sequence[Definition]) -> str:
    """One file's chosen definitions as an outline of it, in its order: each header with its doc's first line, a
    method under its class's header."""
    out: list[str] = []
    shown = {definition.line for definition in definitions}
    for definition in sorted(definitions, key=lambda definition: definition.line):
        if definition.parent and definition.parent_line not in shown:
            out.append(definition.parent)
            shown.add(definition.parent_line)
        indent = definition.signature[: len(definition.signature) - len(definition.signature.lstrip())]
        if definition.doc and definition.doc_above:
            out.append(indent + definition.doc)
        out.append(definition.signature)
        if definition.doc and not definition.doc_above:
            out.append(indent + "    " + definition.doc)
    return "".join(f"{line}\n" for line in out)
