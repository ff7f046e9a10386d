"""Per-language knowledge for post-processing: comment and string syntax, how a block is delimited, and the
document's indentation style.

Pure: no pygls, no torch. The scanner is approximate on purpose (no full lexer): it finds brackets and block
keywords outside strings and comments, which is all post-processing needs, and it never raises on bad code. It reads
the model's text and the parts of the document tree-sitter could not parse (:mod:`.syntax` reads the rest).
"""

from __future__ import annotations

import collections
import enum
import functools
import re
from collections.abc import Iterable

import attrs

PAIRS = {")": "(", "]": "[", "}": "{"}
TAB_WIDTH = 4
"""Columns per tab in a document indented with tabs."""
State = tuple[str, bool, bool] | None
"""Inside a string or comment: (the text that closes it, whether it may span lines, backslash escapes)."""


class Blocks(enum.Enum):
    """How a language delimits a block."""

    INDENT = "indent"
    """By indentation (Python); also the fallback for languages not in the table."""
    BRACES = "braces"
    """By ``{`` ... ``}`` (C family, JavaScript/TypeScript, Go, Rust)."""
    KEYWORDS = "keywords"
    """By keywords: ``function``/``if``/``do`` ... ``end``, ``repeat`` ... ``until`` (Lua)."""


@attrs.frozen(kw_only=True)
class Token:
    """A bracket or block keyword outside strings and comments."""

    line: int
    column: int
    kind: str
    """What pairs it: ``(``, ``[``, ``{``, or the closing keyword (``end``, ``until``)."""
    opens: bool


@attrs.frozen(kw_only=True, eq=False)
class Language:
    """What post-processing knows about one language (one instance per language: compared and hashed by
    identity, which keeps the ``code_of`` cache cheap)."""

    name: str
    blocks: Blocks
    pattern: re.Pattern[str] = attrs.field(eq=False, repr=False)
    """Alternation of skipped literals, string/comment openers (groups ``d0``...), brackets and keywords."""
    delimiters: tuple[tuple[str, bool, bool], ...]
    """For group ``dN``: the closing text (a ``Match.expand`` template), may it span lines, escapes."""
    keywords: dict[str, str] = attrs.field(eq=False)
    """Block keyword -> the keyword that closes it (``if`` -> ``end``); closers map to themselves."""
    header: re.Pattern[str] = attrs.field(eq=False, repr=False)
    """Matches the code of a line that opens a block whose body is indented (``def f():``, ``if x then``)."""
    continuation: re.Pattern[str] = attrs.field(eq=False, repr=False)
    """Matches a line that closes or continues the enclosing block (``}``, ``else:``, ``end``)."""
    scope: re.Pattern[str] | None = attrs.field(eq=False, repr=False)
    """For indentation blocks: a line that starts a scope (``def``, ``class``, a decorator). A completion may
    leave other blocks (``if`` ... ``else``) and return to an enclosing function, but not start a new scope
    outside its own or leave the outermost one. None: every block is a scope."""
    tabs: bool | None
    """Indentation style when the document shows none (None: follow the completion)."""
    unit: int
    """Columns per indentation level when the document shows none."""
    modifiers: frozenset[str] = frozenset()
    """Block keywords that open a block only at the start of a statement (Ruby: ``return if done`` opens none)."""
    loop: re.Pattern[str] | None = attrs.field(default=None, eq=False, repr=False)
    """Matches a loop keyword whose ``do`` later on the line opens no second block (Ruby: ``while x do``)."""

    @property
    def block_kinds(self) -> frozenset[str]:
        """Token kinds that end a block (as opposed to an expression)."""
        if self.blocks is Blocks.KEYWORDS:
            return frozenset({"end", "until"})
        return frozenset({"{"}) if self.blocks is Blocks.BRACES else frozenset()


def _language(
    name: str,
    blocks: Blocks,
    *,
    delimiters: list[tuple[str, str, bool, bool]],
    skip: str | None = None,
    keywords: dict[str, str] | None = None,
    header: str,
    continuation: str,
    scope: str | None = None,
    tabs: bool | None = None,
    unit: int = 4,
    modifiers: frozenset[str] = frozenset(),
    loop: str | None = None,
) -> Language:
    parts = [f"(?P<skip>{skip})"] if skip else []
    parts += [f"(?P<d{i}>{opener})" for i, (opener, *_) in enumerate(delimiters)]
    parts.append(r"(?P<br>[()\[\]{}])")
    keywords = keywords or {}
    if keywords:
        words = sorted(set(keywords) | set(keywords.values()))
        parts.append(rf"(?P<kw>\b(?:{'|'.join(words)})\b)")
        keywords = keywords | {closer: closer for closer in keywords.values()}
    return Language(
        name=name,
        blocks=blocks,
        pattern=re.compile("|".join(parts)),
        delimiters=tuple((closer, multi, esc) for _, closer, multi, esc in delimiters),
        keywords=keywords,
        header=re.compile(header),
        continuation=re.compile(continuation),
        scope=re.compile(scope) if scope else None,
        tabs=tabs,
        unit=unit,
        modifiers=modifiers,
        loop=re.compile(loop) if loop else None,
    )


_SLASH_COMMENTS = [(r"/\*", "*/", True, False), ("//", "\n", False, False)]
_C_CHAR = r"'(?:\\.[^'\n]{0,8}|[^\\'\n])'"
_BRACE_HEADER = r"[{(\[]\s*$"
_BRACE_CONTINUATION = r"^\s*[})\]]"

PYTHON = _language(
    "python",
    Blocks.INDENT,
    delimiters=[
        ("#", "\n", False, False),
        ('"""', '"""', True, True),
        ("'''", "'''", True, True),
        ('"', '"', False, True),
        ("'", "'", False, True),
    ],
    header=r":\s*$",
    continuation=r"^\s*(?:(?:else|elif|except|finally|case)\b|[})\]])",
    scope=r"^\s*(?:(?:async\s+def|def|class)\b|@)",
    tabs=False,
)
JAVASCRIPT = _language(
    "javascript",
    Blocks.BRACES,
    delimiters=[*_SLASH_COMMENTS, ('"', '"', False, True), ("'", "'", False, True), ("`", "`", True, True)],
    header=_BRACE_HEADER,
    continuation=_BRACE_CONTINUATION,
    unit=2,
)
GO = _language(
    "go",
    Blocks.BRACES,
    delimiters=[*_SLASH_COMMENTS, ('"', '"', False, True), ("`", "`", True, False)],
    skip=_C_CHAR,
    header=_BRACE_HEADER,
    continuation=_BRACE_CONTINUATION,
    tabs=True,
)
RUST = _language(
    "rust",
    Blocks.BRACES,
    delimiters=[*_SLASH_COMMENTS, (r'\bb?r(?P<hashes>#*)"', r'"\g<hashes>', True, False), ('b?"', '"', True, True)],
    skip=r"b?'(?:\\u\{[0-9a-fA-F]{1,6}\}|\\.[^'\n]{0,3}|[^\\'\n])'",
    header=_BRACE_HEADER,
    continuation=_BRACE_CONTINUATION,
    tabs=False,
)
C = _language(
    "c",
    Blocks.BRACES,
    delimiters=[*_SLASH_COMMENTS, ('"', '"', False, True)],
    skip=_C_CHAR,
    header=_BRACE_HEADER,
    continuation=_BRACE_CONTINUATION,
)
LUA = _language(
    "lua",
    Blocks.KEYWORDS,
    delimiters=[
        (r"--\[(?P<ceq>=*)\[", r"]\g<ceq>]", True, False),
        ("--", "\n", False, False),
        (r"\[(?P<seq>=*)\[", r"]\g<seq>]", True, False),
        ('"', '"', False, True),
        ("'", "'", False, True),
    ],
    keywords={"function": "end", "if": "end", "do": "end", "repeat": "until"},
    header=r"(?:\b(?:then|do|else|repeat)|[{(\[])\s*$",
    continuation=r"^\s*(?:(?:end|until|else|elseif)\b|[})\]])",
    unit=2,
)
_RUBY_BLOCKS = ("def", "class", "module", "if", "unless", "while", "until", "for", "case", "begin", "do")
RUBY = _language(
    "ruby",
    Blocks.KEYWORDS,
    delimiters=[("#", "\n", False, False), ('"', '"', True, True), ("'", "'", True, True), ("`", "`", True, True)],
    keywords=dict.fromkeys(_RUBY_BLOCKS, "end"),
    header=r"^\s*(?:def|class|module|if|unless|while|until|for|case|begin|else|elsif|when|rescue|ensure)\b"
    r"|\bdo\s*(?:\|[^|]*\|)?\s*$|[{(\[]\s*$",
    continuation=r"^\s*(?:(?:end|else|elsif|when|in|rescue|ensure)\b|[})\]])",
    tabs=False,
    unit=2,
    modifiers=frozenset({"if", "unless", "while", "until"}),
    loop=r"\b(?:while|until|for)\b",
)
FALLBACK = _language(
    "fallback",
    Blocks.INDENT,
    delimiters=[('"', '"', False, True), ("'", "'", False, True)],
    header=r"[:{(\[]\s*$",
    continuation=_BRACE_CONTINUATION,
)
LANGUAGES = {
    "python": PYTHON,
    "javascript": JAVASCRIPT,
    "typescript": JAVASCRIPT,
    "javascriptreact": JAVASCRIPT,
    "typescriptreact": JAVASCRIPT,
    "go": GO,
    "rust": RUST,
    "c": C,
    "cpp": C,
    "cuda-cpp": C,
    "objective-c": C,
    "objective-cpp": C,
    "java": C,
    "csharp": C,
    "lua": LUA,
    "ruby": RUBY,
}
"""By LSP language id; anything else gets FALLBACK (indentation blocks, plain quotes, no comments)."""


def language_for(language_id: str) -> Language:
    """The table entry for an LSP language id, or the indentation-based fallback."""
    return LANGUAGES.get(language_id.lower(), FALLBACK)


@functools.cache
def _body(closer: str, multiline: bool, escapes: bool) -> re.Pattern[str]:
    """Matches the inside of a string or comment up to (not including) its closer or a line break."""
    other = "." if multiline else r"[^\n]"
    if escapes:
        return re.compile(rf"(?:\\.|(?!{re.escape(closer)})(?!\\){other})*", re.S)
    return re.compile(rf"(?:(?!{re.escape(closer)}){other})*", re.S)


def _leave(text: str, start: int, state: tuple[str, bool, bool]) -> tuple[int, State]:
    closer = state[0]
    match = _body(*state).match(text, start)
    end = match.end() if match else start
    if closer and text.startswith(closer, end):
        return end + len(closer), None
    if end < len(text):  # a line break ends a one-line string or comment, closed or not
        return end, None
    return end, state


def _scan_line(
    text: str, number: int, language: Language, state: State, tokens: list[Token], start: int = 0
) -> tuple[State, int]:
    """Append the tokens of one line from column ``start``; return the state after it and where a line comment
    starts (-1: none)."""
    position = start
    while position < len(text):
        if state is not None:
            position, state = _leave(text, position, state)
            if state is not None:
                break
            continue
        match = language.pattern.search(text, position)
        if match is None:
            break
        group = match.lastgroup or ""
        word = match.group()
        if group == "br":
            tokens.append(Token(line=number, column=match.start(), kind=PAIRS.get(word, word), opens=word in "([{"))
        elif group == "kw" and _opens_here(text, match.start(), word, language):
            kind = language.keywords[word]
            tokens.append(Token(line=number, column=match.start(), kind=kind, opens=kind != word))
        elif group.startswith("d"):
            closer, multiline, escapes = language.delimiters[int(group[1:])]
            if closer == "\n":  # a line comment: the rest of the line, and what follows it if the text stops here
                return (None if text.endswith("\n") else (closer, multiline, escapes)), match.start()
            state = (match.expand(closer), multiline, escapes)
        position = max(match.end(), position + 1)
    return state, -1


def _opens_here(text: str, column: int, word: str, language: Language) -> bool:
    """Whether a block keyword at ``column`` counts: not a modifier after a statement, nor a loop's ``do``."""
    before = text[:column]
    if word in language.modifiers and before.rstrip(" \t")[-1:] not in ("", "=", "(", ";", "|", "&"):
        return False
    return not (word == "do" and language.loop is not None and language.loop.search(before))


def scan_line(text: str, number: int, language: Language, state: State, tokens: list[Token], start: int = 0) -> State:
    """Append the tokens of ``text`` (one line, ending with its line break unless the text stops there) from column
    ``start`` on; return the state after it."""
    return _scan_line(text, number, language, state, tokens, start)[0]


def scan(text: str, language: Language, state: State = None) -> tuple[list[Token], list[State], State]:
    """Tokens of ``text`` outside strings and comments, the state at the start of each line, and at the end."""
    tokens: list[Token] = []
    starts: list[State] = []
    lines = text.split("\n")
    for number, line in enumerate(lines):
        starts.append(state)
        state, _ = _scan_line(line if number == len(lines) - 1 else line + "\n", number, language, state, tokens)
    return tokens, starts, state


@functools.lru_cache(maxsize=8192)
def code_of(line: str, language: Language) -> str:
    """The line without a trailing line comment (approximate: the line is scanned on its own).

    Cached: the scope walks ask for the same lines of the prefix many times per request, and again on the
    next keystroke."""
    _, comment = _scan_line(line, 0, language, None, [])
    return line if comment < 0 else line[:comment]


def opens_block(line: str, language: Language) -> bool:
    """Whether the lines after ``line`` belong one level deeper (a header, or an unclosed bracket)."""
    code = code_of(line, language)
    tokens: list[Token] = []
    _scan_line(code, 0, language, None, tokens)
    depth = sum(1 if token.opens else -1 for token in tokens)
    return depth > 0 or bool(language.header.search(code)) or code.rstrip().endswith(("(", "[", "{"))


def is_header(line: str, language: Language) -> bool:
    """Whether ``line`` ends a block header (Python ``def f():``, Lua ``if x then``)."""
    return bool(language.header.search(code_of(line, language)))


def continues_block(line: str, language: Language) -> bool:
    """Whether ``line`` closes or continues the enclosing block, so the lines before it sit deeper."""
    return bool(language.continuation.match(line))


def pair_tokens(tokens: Iterable[Token]) -> tuple[list[Token], list[Token]]:
    """(openers still open at the end, closers that close something opened before ``tokens``).

    A closer pops up to the nearest opener of its kind (inner openers left unclosed are dropped); one with no
    opener of its kind closes something before the text, e.g. before a prefix cut to a budget.
    """
    still_open: list[Token] = []
    closed_before: list[Token] = []
    for token in tokens:
        if token.opens:
            still_open.append(token)
        elif any(opener.kind == token.kind for opener in still_open):
            while still_open.pop().kind != token.kind:
                pass
        else:
            closed_before.append(token)
    return still_open, closed_before


def columns(line: str, unit: int) -> int:
    """Width of the line's leading whitespace, tabs stopping every ``unit`` columns."""
    cols = 0
    for char in line:
        if char == " ":
            cols += 1
        elif char == "\t":
            cols = (cols // unit + 1) * unit
        else:
            break
    return cols


def indent_style(before: list[str], after: list[str], completion: list[str], language: Language) -> tuple[bool, int]:
    """(tabs?, columns per level) as the document shows them, else the language's, else the completion's.

    ``before`` ends with the cursor's line: indentation typed there counts twice (it is what the user's editor
    just did), even on an otherwise empty line. Of equally common steps the larger wins.
    """
    tab_lines = space_lines = 0
    steps: collections.Counter[int] = collections.Counter()
    previous: int | None = None
    typed = [before[-1]] if before and before[-1] and not before[-1].strip(" \t") else []
    for line in (*before[-300:-1], *typed, *after[:100]):
        if not line.strip() and line not in typed:
            continue
        lead = line[: len(line) - len(line.lstrip(" \t"))]
        tab_lines += lead.startswith("\t")
        space_lines += lead.startswith(" ")
        width = None if "\t" in lead else len(lead)
        if width is not None and previous is not None and 0 < width - previous <= 8:
            steps[width - previous] += 2 if line in typed else 1
        previous = width
    if tab_lines or space_lines:
        tabs = tab_lines > space_lines
    elif language.tabs is not None:
        tabs = language.tabs
    else:
        tabs = any(line.startswith("\t") for line in completion)
    if tabs:
        return True, TAB_WIDTH
    return False, max(steps, key=lambda step: (steps[step], step)) if steps else language.unit
