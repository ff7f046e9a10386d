"""Open documents kept as lists of lines, so that a keystroke costs its line, not the document.

pygls' ``TextDocument`` keeps one string: every incremental change splits it into lines, copies each of them in a
Python loop and joins them again, so a keystroke costs the whole document (``benchmarks/big_document.py`` measures
it), and every read of ``lines`` splits it anew. A ``LineDocument`` keeps the lines themselves: a change replaces
the lines its range spans and leaves the others, the very same objects, in place; the whole text is joined only when
``source`` is read.

Lines end at ``\\n``, ``\\r\\n`` and ``\\r`` only, as the LSP counts them. pygls splits with ``str.splitlines``,
which also breaks at ``\\x0b``, ``\\x0c``, ``\\x1c``-``\\x1e``, ``\\x85``, ``\\u2028`` and ``\\u2029``, so that its
positions after such a character are not the editor's.
"""

from __future__ import annotations

import re
from array import array
from collections.abc import Callable, Sequence
from itertools import accumulate, islice

from lsprotocol import types
from pygls.workspace import PositionCodec, ServerTextPosition, TextDocument, Workspace

from diffgemma_lsp.language_ids import lsp_language_id

LINE_ENDINGS = ("\r\n", "\n", "\r")
"""The only line breaks the LSP knows."""
_OTHER_BREAKS = "\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"
"""What ``str.splitlines`` breaks at besides ``LINE_ENDINGS``."""
_LINE = re.compile(r"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+")

Replaced = Callable[[int, Sequence[str], Sequence[str], Sequence[str]], None]
"""Told of each change before it is made: (first line, the old lines there, the new lines, the document's lines)."""


def split_lines(text: str) -> list[str]:
    """``text`` cut after each LSP line break (``\\n``, ``\\r\\n``, ``\\r``), each line with its break. As with
    ``str.splitlines``, no empty line follows a final break: ``"a\\n"`` is one line, ``""`` none."""
    if not any(char in text for char in _OTHER_BREAKS):
        return text.splitlines(keepends=True)  # the same lines, about 2.5 times as fast as the expression
    return _LINE.findall(text)


def _content(line: str) -> str:
    """The line without its line break."""
    return line.rstrip("\r\n")  # a line holds no break but its last one, so this strips exactly that


class LineDocument(TextDocument):
    """A text document kept as a list of lines, each with its line break (see the module's docstring).

    ``lines`` is that list, not a copy: read it, never change it. ``source`` is its join, kept until the next
    change. The offsets of line starts (``offset_at_line``) are kept too, up to the first line a change touched.
    """

    def __init__(
        self,
        uri: str,
        source: str | None = None,
        version: int | None = None,
        language_id: str | None = None,
        local: bool = True,
        sync_kind: types.TextDocumentSyncKind = types.TextDocumentSyncKind.Incremental,
        position_codec: PositionCodec | None = None,
    ) -> None:
        # one id per language whatever the editor calls it (Neovim's ``cs`` is ``csharp``): every reader sees LSP's
        language_id = lsp_language_id(language_id) if language_id is not None else None
        super().__init__(uri, source, version, language_id, local, sync_kind, position_codec)
        self._lines: list[str] | None = split_lines(source) if source is not None else None
        """None until a document that was not opened (``source`` None) is read from disk."""
        self._starts = array("q", [0])
        """``_starts[i]``: the offset of line ``i``'s start, for ``i < _known`` (the rest is stale)."""
        self._known = 1
        # pygls' ``_source`` is the join of ``_lines`` here, None when a change made it stale.
        self.on_replace: Replaced | None = None
        """Told of each change's lines before they are replaced (the edit history's input)."""

    def _line_list(self) -> list[str]:
        if self._lines is None:  # not opened: the file on disk, read once (pygls reads it at every access)
            text = super().source
            self._lines, self._source = split_lines(text), text
        return self._lines

    @property
    def lines(self) -> Sequence[str]:
        """The document's lines, each with its line break: the document's own list (not a copy, not split anew)."""
        return self._line_list()

    @property
    def source(self) -> str:
        """The document's text (joined once per change)."""
        lines = self._line_list()
        if self._source is None:
            self._source = "".join(lines)
        return self._source

    def _apply_incremental_change(self, change: types.TextDocumentContentChangePartial) -> None:
        """Replace the lines that ``change.range`` spans with the lines of their edited text."""
        lines = self._line_list()
        first, column = self._server_position(change.range.start)
        last, end_column = self._server_position(change.range.end)
        if (last, end_column) < (first, column):
            first, column, last, end_column = last, end_column, first, column
        head = lines[first][:column] if first < len(lines) else ""
        tail = lines[last][end_column:] if last < len(lines) else ""  # it keeps the last line's break
        text = head + change.text + tail
        if text.startswith("\n") and first > 0 and lines[first - 1].endswith("\r"):
            first -= 1  # that "\r" and this "\n" make one "\r\n" line break, as in a split of the whole new text
            text = lines[first] + text
        # The edited text ends with the last spanned line's own break, unless that line is the document's last:
        # the lines after it start where they started, and none can begin with a "\n" after a "\r" (it would
        # have been one "\r\n" before). Positions never fall inside a "\r\n" (``_server_position``).
        new = split_lines(text)
        if self.on_replace is not None:
            self.on_replace(first, lines[first : last + 1], new, lines)
        lines[first : last + 1] = new
        self._source = None
        self._known = min(self._known, first + 1)

    def _apply_full_change(self, change: types.TextDocumentContentChangeEvent) -> None:
        """Take the new text whole (``on_replace`` is told the lines between the common head and tail)."""
        new = split_lines(change.text)
        if self.on_replace is not None:
            old = self._line_list()
            head = next((i for i, (a, b) in enumerate(zip(old, new, strict=False)) if a != b), min(len(old), len(new)))
            tail = 0
            while tail < min(len(old), len(new)) - head and old[-1 - tail] == new[-1 - tail]:
                tail += 1
            self.on_replace(head, old[head : len(old) - tail], new[head : len(new) - tail], old)
        self._lines = new
        self._source = change.text
        self._starts, self._known = array("q", [0]), 1

    def _server_position(self, position: types.Position) -> tuple[int, int]:
        """``position`` (client units) as (line, code points into it), clamped as LSP says: a character past the
        end of its line is the end of the line (before its break, never inside a ``\\r\\n``), a line past the
        end of the document is the end of the document. The codec converts the units (UTF-16 unless told)."""
        lines = self._line_list()
        if position.line >= len(lines):
            if not lines:
                return 0, 0
            ends_with_break = lines[-1].endswith(LINE_ENDINGS)
            return (len(lines), 0) if ends_with_break else (len(lines) - 1, len(lines[-1]))
        line = max(position.line, 0)
        content = _content(lines[line])
        character = max(position.character, 0)
        if content.isascii():  # one code unit a character in UTF-8, UTF-16 and UTF-32
            return line, min(character, len(content))
        codec = self.position_codec
        clamped = types.Position(line=0, character=min(character, codec.client_num_units(content)))
        return line, codec.position_from_client_units([content], clamped).character

    def offset_at_line(self, line: int) -> int:
        """The offset (code points into ``source``) of ``line``'s start; ``len(lines)`` and beyond: the end of
        the document. Kept between calls up to the first line changed since, so typing on a line finds it at
        once and moving down sums only the lines passed."""
        lines = self._line_list()
        line = min(max(line, 0), len(lines))
        known = self._known
        if line >= known:
            starts = accumulate(map(len, lines[known - 1 : line]), initial=self._starts[known - 1])
            self._starts[known : line + 1] = array("q", islice(starts, 1, None))  # one C loop, no Python one
            self._known = line + 1
        return self._starts[line]

    def offset_at_server_position(self, server_position: ServerTextPosition) -> int:
        """``server_position`` (code points) as an offset into ``source``, from the kept line starts."""
        return server_position.character + self.offset_at_line(server_position.line)


class LineWorkspace(Workspace):
    """pygls' workspace, with its text documents made ``LineDocument``s."""

    @classmethod
    def like(cls, workspace: Workspace) -> LineWorkspace:
        """A LineWorkspace in the state of ``workspace`` (root, folders, sync kind, position encoding: whatever
        pygls' constructor set, copied rather than passed again), its text documents made LineDocuments."""
        line_workspace = cls.__new__(cls)
        vars(line_workspace).update(vars(workspace))
        line_workspace._text_documents = {
            uri: line_workspace._create_text_document(doc.uri, doc.source, doc.version, doc.language_id)
            for uri, doc in workspace.text_documents.items()
        }
        return line_workspace

    def _create_text_document(
        self,
        doc_uri: str,
        source: str | None = None,
        version: int | None = None,
        language_id: str | None = None,
    ) -> LineDocument:
        return LineDocument(
            doc_uri,
            source=source,
            version=version,
            language_id=language_id,
            sync_kind=self._sync_kind,
            position_codec=self.position_codec,
        )
