"""The document around the cursor read with tree-sitter: its brackets, block keywords, strings and comments.

A document being typed is rarely whole: the line at the cursor, a block not yet closed at the end of a file, a
string just opened. tree-sitter recovers from such errors by guessing, and about an unterminated string or comment
it guesses worse than the hand-written scanner of :mod:`.languages` (a ``/*`` without its ``*/`` becomes a
division). So the document is read in two ways at once: every subtree the parser read without an error is taken
from the parse tree, which reads what the scanner cannot (a Java text block, a JavaScript regex literal, a C#
verbatim string, a Python f-string with quotes inside, a Ruby ``if`` modifier), and the rest of each erroneous node
is scanned as before, from outside any string. The model's text after the cursor is still scanned, from the state
found here: it is a fragment, which a parser reads worse than a scanner.

Pure apart from the grammar wheels (``diffgemma_lsp.grammars``; none is downloaded).
"""

from __future__ import annotations

import bisect
import functools
import logging
import sys

import attrs
from tree_sitter import Node, Parser, Query, QueryCursor

from diffgemma_lsp import grammars
from diffgemma_lsp.postprocess.languages import PAIRS, Blocks, Language, State, Token, scan, scan_line

logger = logging.getLogger(__name__)
OPAQUE = frozenset(
    {
        "comment",
        "line_comment",
        "block_comment",
        "html_comment",
        "string",
        "template_string",
        "regex",
        "string_literal",
        "raw_string_literal",
        "interpreted_string_literal",
        "rune_literal",
        "char_literal",
        "character_literal",
        "verbatim_string_literal",
        "interpolated_string_expression",
        "system_lib_string",
        "string_array",
        "symbol_array",
        "heredoc_body",
        "character",
    }
)
"""Node types read as one piece: what is inside them is neither a bracket nor a keyword."""
LINE_COMMENT = ("\n", False, False)
Position = tuple[int, int]
"""(line, column in characters) in the document."""


@attrs.frozen(kw_only=True)
class DocumentScan:
    """What the filters need from the document: the same as scanning the prefix, then the suffix from its end."""

    before: tuple[Token, ...]
    """Brackets and block keywords before the cursor, at their lines and columns in the prefix."""
    starts: tuple[State, ...]
    """The state at the start of each of the prefix's lines."""
    state: State
    """The string or comment the cursor is in (None: code)."""
    after: tuple[Token, ...]
    """Brackets and block keywords after the cursor (the cursor's line is line 0)."""


@functools.lru_cache(maxsize=8)
def scan_document(before: str, after: str, language: Language, language_id: str) -> DocumentScan:
    """Scan the document around the cursor (LF text): with the tree where the language has a grammar.

    Cached: each of a request's candidate answers is post-processed against the same document. A grammar that
    fails is logged and the scanner reads the document alone: a completion is never lost to it."""
    if (parser := grammars.parser(language_id.lower())) is not None:
        try:
            return _TreeScan(before, after, language, language_id.lower(), parser).result()
        except Exception:
            logger.warning("the %s grammar failed on a document: scanned instead", language_id, exc_info=True)
    tokens, starts, state = scan(before, language)
    after_tokens = scan(after, language, state)[0]
    return DocumentScan(before=tuple(tokens), starts=tuple(starts), state=state, after=tuple(after_tokens))


@functools.cache
def _queries(language_id: str, language: Language) -> tuple[Query, frozenset[str]] | None:
    """A query capturing the brackets, block keywords and opaque nodes this grammar has; and its keyword types."""
    found = grammars.language(language_id)
    if found is None:
        return None
    keywords = frozenset(language.keywords) if language.blocks is Blocks.KEYWORDS else frozenset()
    kinds = ("(", ")", "[", "]", "{", "}", *sorted(keywords))
    anonymous = [kind for kind in kinds if found.id_for_node_kind(kind, False)]
    named = [kind for kind in sorted(OPAQUE) if found.id_for_node_kind(kind, True)]
    source = " ".join([*(f'"{kind}" @token' for kind in anonymous), *(f"({kind}) @opaque" for kind in named)])
    return Query(found, source), keywords


class _TreeScan:
    """One document read with its parse tree and, inside the tree's errors, the scanner."""

    def __init__(self, before: str, after: str, language: Language, language_id: str, parser: Parser) -> None:
        self.language = language
        text = before + after
        self.lines = text.split("\n")
        self.encoded = None if text.isascii() else [line.encode() for line in self.lines]
        before_lines = before.split("\n")
        self.cursor: Position = (len(before_lines) - 1, len(before_lines[-1]))
        self.cursor_byte = len(before.encode())
        queries = _queries(language_id, language)
        assert queries is not None  # the grammar has a parser, so it has a language
        self.tree = parser.parse(text.encode())
        self.query, self.keywords = queries
        self.gaps: list[tuple[Position, Position]] = []
        """Where the scanner read the document, in order."""
        self.scan_state: State = None
        self.line_states: dict[int, State] = {}
        self.cursor_state: State = None
        self.cursor_in_gap = False
        self.tokens: list[Token] = []

    def result(self) -> DocumentScan:
        root = self.tree.root_node
        if root.has_error:
            self._read_erroneous(root, (0, 0), (len(self.lines) - 1, len(self.lines[-1])))
        opaque = self._tree_tokens()
        self.tokens.sort(key=lambda token: (token.line, token.column))
        row, column = self.cursor
        quoted = self._quoted_lines(opaque)
        starts = [self.line_states.get(number, quoted.get(number)) for number in range(row + 1)]
        state = self.cursor_state if self.cursor_in_gap else self._state_at_cursor(opaque)
        before = [token for token in self.tokens if (token.line, token.column) < self.cursor]
        after = [
            attrs.evolve(token, line=token.line - row, column=token.column - (column if token.line == row else 0))
            for token in self.tokens
            if (token.line, token.column) >= self.cursor
        ]
        return DocumentScan(before=tuple(before), starts=tuple(starts), state=state, after=tuple(after))

    def _position(self, point: tuple[int, int]) -> Position:
        """A tree-sitter point (a byte column) as a line and a column in characters."""
        row, column = point
        if self.encoded is None or row >= len(self.encoded):
            return row, column
        return row, len(self.encoded[row][:column].decode(errors="ignore"))

    def _in_gap(self, position: Position) -> bool:
        if not self.gaps:
            return False
        index = bisect.bisect_right(self.gaps, (position, (sys.maxsize, 0))) - 1
        return index >= 0 and self.gaps[index][0] <= position < self.gaps[index][1]

    # --- where the tree has errors ---------------------------------------------------------------------------

    def _read_erroneous(self, node: Node, start: Position, end: Position) -> None:
        """Scan an erroneous node's text outside its error-free subtrees, and those where the scanner is in a string.

        An error-free subtree inside an error is trusted only where the scanner, reading up to it, is in code:
        error recovery reads the text of an unterminated string as code, and its quotes as new strings.
        """
        at = start
        for child in node.children:
            if child.is_missing or (child.child_count == 0 and child.type not in OPAQUE):
                continue  # a leaf of an erroneous node: scanned with the text around it
            child_start, child_end = self._position(child.start_point), self._position(child.end_point)
            if at < child_start:
                self._scan(at, child_start)
            if child.has_error:
                self._read_erroneous(child, max(at, child_start), child_end)
            elif self.scan_state is not None and at < child_end:
                self._scan(max(at, child_start), child_end)
            at = max(at, child_end)
        if at < end:
            self._scan(at, end)

    def _scan(self, start: Position, end: Position) -> None:
        """Scan from ``start`` to ``end`` on from the scanner's state, noting it at line starts and the cursor."""
        self.gaps.append((start, end))
        state = self.scan_state
        for number in range(start[0], end[0] + 1):
            first = start[1] if number == start[0] else 0
            if first == 0:
                self.line_states[number] = state
            line = self.lines[number] + ("\n" if number < len(self.lines) - 1 else "")
            last = end[1] if number == end[0] else len(line)
            if number == self.cursor[0] and first <= self.cursor[1] <= last:
                state = scan_line(line[: self.cursor[1]], number, self.language, state, self.tokens, first)
                self.cursor_state, self.cursor_in_gap = state, True
                first = self.cursor[1]
            state = scan_line(line[:last], number, self.language, state, self.tokens, first)
        self.scan_state = state

    # --- where it has none -----------------------------------------------------------------------------------

    def _tree_tokens(self) -> list[Node]:
        """Add the tree's brackets and keywords outside the gaps and strings; return the outermost opaque nodes."""
        captures = QueryCursor(self.query).captures(self.tree.root_node)
        opaque: list[Node] = []
        for node in sorted(captures.get("opaque", []), key=lambda node: (node.start_byte, -node.end_byte)):
            inside = opaque and node.start_byte < opaque[-1].end_byte
            if not inside and not node.has_error and not self._in_gap(self._position(node.start_point)):
                opaque.append(node)
        starts = [node.start_byte for node in opaque]
        for node in captures.get("token", []):
            index = bisect.bisect_left(starts, node.start_byte) - 1
            if node.is_missing or (index >= 0 and node.start_byte < opaque[index].end_byte):
                continue
            position = self._position(node.start_point)
            if self._in_gap(position) or not self._counts(node):
                continue
            kind = node.type
            opens = kind in "([{" or self.language.keywords.get(kind, kind) != kind
            kind = PAIRS.get(kind, self.language.keywords.get(kind, kind))
            self.tokens.append(Token(line=position[0], column=position[1], kind=kind, opens=opens))
        return opaque

    def _counts(self, node: Node) -> bool:
        """Whether a block keyword opens a block: not a modifier (Ruby ``return if x``), nor a loop's own ``do``, and
        its construct is closed by the keyword's closer (not Ruby's endless ``def f = x``)."""
        kind = node.type
        if kind not in self.keywords:
            return True  # asked before the parent: tree-sitter finds a node's parent from the root, O(depth)
        parent = node.parent
        if parent is None:
            return True
        closer = self.language.keywords[kind]
        if closer == kind:
            return True
        if parent.type.endswith("_modifier") or (kind == "do" and parent.type == "do"):
            return False
        return any(
            child.type == closer or (child.child_count > 0 and child.children[-1].type == closer)
            for child in parent.children
        )

    def _quoted_lines(self, opaque: list[Node]) -> dict[int, State]:
        """The lines that start inside a string or comment the tree read, with the state there."""
        quoted: dict[int, State] = {}
        for node in opaque:
            first, last = self._position(node.start_point), self._position(node.end_point)
            if last[0] > first[0]:
                state = _state_of(node, self.language)
                for number in range(first[0] + 1, last[0] + (last[1] > 0)):
                    quoted[number] = state
        return quoted

    def _state_at_cursor(self, opaque: list[Node]) -> State:
        for node in opaque:
            if node.start_byte < self.cursor_byte < node.end_byte:
                return _state_of(node, self.language)
            if node.end_byte == self.cursor_byte and _state_of(node, self.language) == LINE_COMMENT:
                return LINE_COMMENT  # at the end of a line comment, still in it
        return None


def _state_of(node: Node, language: Language) -> State:
    """The scanner's state inside an opaque node: the text that closes it, whether it spans lines, escapes."""
    text = (node.text or b"").decode(errors="ignore")
    last = node.children[-1] if node.child_count >= 2 else None
    if last is not None and last.child_count == 0 and (not last.is_named or last.type.endswith("_end")):
        opener, closer = node.children[0].text or b"", (last.text or b"").decode(errors="ignore")
        raw = "raw" in node.type or "verbatim" in node.type or opener.lstrip(b"bfuBFU").startswith((b"r", b"R", b"@"))
        if closer and not closer.isspace():
            return closer, node.start_point[0] != node.end_point[0] or len(closer) > 1, not raw
    tokens: list[Token] = []
    state = scan_line(text.split("\n", 1)[0], 0, language, None, tokens)
    if "\n" not in text and (state == LINE_COMMENT or text.startswith(("//", "#", "--"))):
        return LINE_COMMENT
    if text.startswith("/*"):
        return "*/", True, False
    return state if state is not None else ("\n", False, False)
