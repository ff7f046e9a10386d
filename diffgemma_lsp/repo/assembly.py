"""What a prompt takes from the workspace index for a cursor: the definitions of the names the code there uses
(the identifiers near the cursor first, then what the file imports), then windows of other files like the lines
before the cursor; cut to a budget and put in a stable order (by path, then line), so that the prompt's head stays
put while the user types on one line.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import attrs

from diffgemma_lsp.repo.bindings import Binding, bindings_of
from diffgemma_lsp.repo.cursor_names import chains_at
from diffgemma_lsp.repo.definitions import Definition
from diffgemma_lsp.repo.imports import Imported, import_statements, imports_of
from diffgemma_lsp.repo.index import WorkspaceIndex
from diffgemma_lsp.repo.instances import MAX_LINES, instance_types
from diffgemma_lsp.repo.resolve import by_name_alone, constructors_of, resolve, scope_of
from diffgemma_lsp.repo.snippets import WINDOW_LINES, Snippet, tokens_of

LINES_BEFORE = 8
"""Lines above the cursor whose identifiers are "near" it (Zed's Zeta looks a few lines around the cursor)."""
LINES_AFTER = 2
MEMBERS_PER_CLASS = 12
"""Methods shown under a class whose name is used near the cursor."""
USE_LINES = 200
"""How far from the cursor an imported name's uses are looked for, to rank it."""
SNIPPETS = 2
DEFINITION_SHARE = 0.75
"""Of the budget, what the definitions may take before the snippets get theirs (they take what is left)."""
CURSOR_SHARE = 0.15
"""Of the budget, what the definitions of the names at the cursor have (kept whether they use it or not, so that
what comes before them in the prompt does not move when they change): about 300 characters, a class's header, doc
and ``__init__``. A quarter held as many of the typed names and cost the names not yet typed (``repo_context_eval``'s
lines) 1.2 points more."""
CURSOR_NAMES = 3
"""Names resolved on the cursor's line that keep their definitions while the user stays on it (the newest last):
a definition that came and went with every keystroke would change the prompt with each."""
DEFINITION = "definition"
CURSOR_DEFINITION = "definition at the cursor"
SNIPPET = "snippet"
RECENT_FILE = "recent file"
RECENT_EDIT = "recent edit"
"""The origins of a chunk (the last two are the ring buffer's and the edit history's, not the index's)."""
_IDENTIFIER = re.compile(r"[A-Za-z_$][\w$]*")


@attrs.frozen
class ContextChunk:
    """A piece of context for the prompt, with where it comes from."""

    origin: str
    """``definition``, ``definition at the cursor``, ``snippet``, ``recent file`` or ``recent edit``."""
    path: str
    """The file, as the prompt names it (relative to its workspace folder)."""
    text: str


def identifiers_near(lines: Sequence[str], line: int) -> list[str]:
    """The identifiers around ``line``, nearest line first (one above, one below, two above...), each once. Not
    those of ``line`` itself: what is typed there would change the prompt's head on every keystroke, and the name
    being typed is what the model is to write."""
    order = []
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
        self._uses: dict[str, tuple[tuple[int, int, tuple[str, ...]], list[str]]] = {}
        self._statements: tuple[str, str, tuple[str, ...]] | None = None
        self._bindings: dict[str, tuple[tuple[str, ...], list[Binding]]] = {}
        self._cursor: dict[str, tuple[int, list[tuple[str, ...]]]] = {}
        """path -> (the cursor's line, the chains resolved on it, the newest last)."""
        self._instances: dict[str, tuple[tuple[int, int, bool, str], dict[str, tuple[str, ...]]]] = {}
        self._shown: dict[str, set[tuple[str, int]]] = {}
        """path -> the definitions its last ``chunks`` held (not repeated at the cursor)."""

    def forget(self, path: str) -> None:
        self._imports.pop(path, None)
        self._snippets.pop(path, None)
        self._uses.pop(path, None)
        self._bindings.pop(path, None)
        self._cursor.pop(path, None)
        self._shown.pop(path, None)
        self._instances.pop(path, None)

    def chunks(
        self, path: str, text: str, lines: Sequence[str], language_id: str, line: int, budget_chars: int
    ) -> list[ContextChunk]:
        """The chunks for a cursor on ``line`` of ``text`` (the file at ``path``; ``lines``, its lines as LSP counts
        them), within ``budget_chars``: definitions (by path), then snippets (by path)."""
        if budget_chars <= 0:
            return []
        index = self.index
        imported = self._imported(path, text, language_id)
        local = {definition.name for definition in index.definitions_in(path)}
        near = [name for name in identifiers_near(lines, line) if name not in local]
        taken = [name for entry in imported for name in entry.names if name not in local and name not in near]
        ranked = _ranked_definitions(index, path, near, self._by_nearest_use(path, lines, line, taken), imported)
        budget_chars -= int(budget_chars * CURSOR_SHARE)
        chosen, used = _within(ranked, int(budget_chars * DEFINITION_SHARE))
        self._shown[path] = {(d.path, d.line) for definitions in chosen.values() for d in definitions}
        chunks = [
            ContextChunk(origin=DEFINITION, path=index.relative(file), text=render(definitions))
            for file, definitions in sorted(chosen.items())
        ]
        snippets: list[ContextChunk] = []
        room = budget_chars - used
        for snippet, window in self._similar(path, lines[max(line - WINDOW_LINES, 0) : line]):
            body = "".join(f"{window_line}\n" for window_line in window)
            if len(body) <= room:
                snippets.append(ContextChunk(origin=SNIPPET, path=index.relative(snippet.path), text=body))
                room -= len(body)
        return chunks + sorted(snippets, key=lambda chunk: chunk.path)

    def cursor_chunks(
        self, path: str, text: str, lines: Sequence[str], language_id: str, line: int, column: int, budget_chars: int
    ) -> list[ContextChunk]:
        """The definitions of the names at or just before the cursor (``column`` on ``line``, in characters) and of
        the names resolved earlier on this line, newest last, within ``CURSOR_SHARE`` of ``budget_chars``: a class
        with its constructor, a method under its class. Not those :meth:`chunks` holds already. For the end of the
        prompt's context, nearest the cursor: they change as the user types."""
        if budget_chars <= 0 or not 0 <= line < len(lines):
            return []
        kept_line, kept = self._cursor.get(path, (line, []))
        chains = list(kept) if kept_line == line else []
        for chain in reversed(chains_at(lines[line].rstrip("\r\n"), column, language_id)):
            if chain in chains:
                chains.remove(chain)
            chains.append(chain)  # the name the cursor is on last: the newest
        bindings = self._bindings_of(path, text, language_id)
        scope = scope_of(
            self.index, path, language_id, line, bindings, self._instances_of(path, lines, line, language_id)
        )
        resolved = [(chain, found) for chain in chains if (found := resolve(chain, scope))][-CURSOR_NAMES:]
        self._cursor[path] = (line, [chain for chain, _ in resolved])
        taken = set(self._shown.get(path, set()))
        room = int(budget_chars * CURSOR_SHARE)
        groups: list[list[Definition]] = []
        for _, found in reversed(resolved):  # the newest first, while they fit
            with_constructors = [shown for d in found for shown in (d, *constructors_of(d, self.index))]
            # a class without its ``__init__`` if both do not fit; one overload of a name if all of them do not
            for candidates in (with_constructors, found, found[:1]):
                group = list({(d.path, d.line): d for d in candidates if (d.path, d.line) not in taken}.values())
                size = sum(len(text) for text in _rendered_by_file(group).values())
                if group and size <= room:
                    groups.insert(0, group)
                    taken.update((d.path, d.line) for d in group)
                    room -= size
                    break
        by_file = _rendered_by_file([d for group in groups for d in group])
        return [
            ContextChunk(origin=CURSOR_DEFINITION, path=self.index.relative(file), text=rendered)
            for file, rendered in by_file.items()
        ]

    def _instances_of(self, path: str, lines: Sequence[str], line: int, language_id: str) -> dict[str, tuple[str, ...]]:
        """:func:`instance_types` of the function the cursor is in (where the index's last look at the file put a
        definition at or above the cursor), again only when its lines above the cursor change."""
        above = [definition for definition in self.index.definitions_in(path) if definition.line <= line]
        start = above[-1].line if above else 0
        in_method = bool(above) and above[-1].kind == "method"
        key = (start, line, in_method, "".join(lines[max(start, line - MAX_LINES) : line]))
        cached = self._instances.get(path)
        if cached is not None and cached[0] == key:
            return cached[1]
        found = instance_types(lines, start, line, language_id, in_method)
        self._instances[path] = (key, found)
        return found

    def _bindings_of(self, path: str, text: str, language_id: str) -> list[Binding]:
        statements = self._statements_of(text, language_id)
        cached = self._bindings.get(path)
        if cached is not None and cached[0] == statements:
            return cached[1]
        found = bindings_of(statements, language_id)
        self._bindings[path] = (statements, found)
        return found

    def _statements_of(self, text: str, language_id: str) -> tuple[str, ...]:
        """:func:`import_statements`, once per text (:meth:`chunks` and :meth:`cursor_chunks` read the same)."""
        if self._statements is not None and self._statements[0] is text and self._statements[1] == language_id:
            return self._statements[2]
        statements = import_statements(text, language_id)
        self._statements = (text, language_id, statements)
        return statements

    def _imported(self, path: str, text: str, language_id: str) -> list[Imported]:
        statements = self._statements_of(text, language_id)
        cached = self._imports.get(path)
        if cached is not None and cached[0] == statements and cached[1] == self.index.files_version:
            return cached[2]
        roots = [str(root) for root in self.index.roots]
        found = imports_of("\n".join(statements), language_id, path, roots, self.index.__contains__)
        self._imports[path] = (statements, self.index.files_version, found)
        return found

    def _by_nearest_use(self, path: str, lines: Sequence[str], line: int, names: list[str]) -> list[str]:
        """:func:`by_nearest_use`, again only when the cursor moves to another line, the file's length changes
        or the names do (typing on one line changes neither, and the cursor's own line is not looked at)."""
        key = (line, len(lines), tuple(names))
        cached = self._uses.get(path)
        if cached is not None and cached[0] == key:
            return cached[1]
        found = by_nearest_use(lines, line, names)
        self._uses[path] = (key, found)
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
    index: WorkspaceIndex, path: str, near: list[str], taken: list[str], imported: list[Imported]
) -> list[Definition]:
    """The definitions worth showing, best first: of the names ``near`` the cursor (a class with its methods),
    then of the names the file imports (``taken``, best first; a class without its methods)."""
    imported_files = {entry.path for entry in imported}
    ranked: dict[tuple[str, int], Definition] = {}
    for name in [*near, *taken]:
        found = [definition for definition in index.definitions_named(name) if definition.path != path]
        preferred = [definition for definition in found if definition.path in imported_files]
        # a name the file does not import: only what another file can reach (no nested helper), in few files
        for definition in preferred or by_name_alone(name, index, exclude_path=path):
            ranked.setdefault((definition.path, definition.line), definition)
            if name in near and definition.kind in ("class", "interface"):
                members = [
                    member for member in index.definitions_in(definition.path) if member.parent_line == definition.line
                ]
                for member in members[:MEMBERS_PER_CLASS]:
                    ranked.setdefault((member.path, member.line), member)
    return list(ranked.values())


def by_nearest_use(lines: Sequence[str], line: int, names: list[str]) -> list[str]:
    """``names`` ordered by how far from ``line`` each is used (looking at most ``USE_LINES`` lines each way; names
    not seen there keep their order, after the others)."""
    wanted = dict.fromkeys(names)
    distance: dict[str, int] = {}
    for step in range(1, USE_LINES + 1):
        for number in (line - step, line + step):
            if 0 <= number < len(lines):
                for name in _IDENTIFIER.findall(lines[number]):
                    if name in wanted and name not in distance:
                        distance[name] = step
        if len(distance) == len(wanted) or (line - step < 0 and line + step >= len(lines)):
            break
    return sorted(wanted, key=lambda name: distance.get(name, USE_LINES + 1))


def _within(ranked: list[Definition], budget: int) -> tuple[dict[str, list[Definition]], int]:
    """The best of ``ranked`` whose rendering fits ``budget`` characters, by file, and the characters used (counted
    as :func:`render` writes them; a class header shown as a method's parent and chosen later counts twice)."""
    chosen: dict[str, list[Definition]] = {}
    headers: dict[str, set[int]] = {}
    used = 0
    for definition in ranked:
        shown = headers.setdefault(definition.path, set())
        size = sum(len(line) + 1 for line in _lines_of(definition))
        if definition.parent and definition.parent_line not in shown:
            size += len(definition.parent) + 1
        if used + size > budget:
            continue
        used += size
        shown.update((definition.line, definition.parent_line))
        chosen.setdefault(definition.path, []).append(definition)
    return chosen, used


def _rendered_by_file(definitions: Sequence[Definition]) -> dict[str, str]:
    """:func:`render` of each file's ``definitions``, the files in the order they first come."""
    by_file: dict[str, list[Definition]] = {}
    for definition in definitions:
        by_file.setdefault(definition.path, []).append(definition)
    return {file: render(found) for file, found in by_file.items()}


def render(definitions: Sequence[Definition]) -> str:
    """One file's chosen definitions as an outline of it, in its order: each header with its doc's first line, a
    method under its class's header."""
    out: list[str] = []
    shown = {definition.line for definition in definitions}
    for definition in sorted(definitions, key=lambda definition: definition.line):
        if definition.parent and definition.parent_line not in shown:
            out.append(definition.parent)
            shown.add(definition.parent_line)
        out += _lines_of(definition)
    return "".join(f"{line}\n" for line in out)


def _lines_of(definition: Definition) -> list[str]:
    """The definition's header with its doc: a comment above it, a docstring under it (indented one level)."""
    if not definition.doc:
        return [definition.signature]
    indent = definition.signature[: len(definition.signature) - len(definition.signature.lstrip())]
    if definition.doc_above:
        return [indent + definition.doc, definition.signature]
    return [definition.signature, indent + "    " + definition.doc]
