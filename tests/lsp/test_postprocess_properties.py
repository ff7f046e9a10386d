"""Properties of post-processing over arbitrary documents and model outputs (hypothesis).

For any prefix, suffix and raw text: postprocess never raises; the edit, applied the way the server applies it
(insert at the cursor, or replace the rest of the cursor's line when ``replace_to_eol``), leaves everything
outside its range as it was and replaces only closing characters; it never puts a copy of the suffix's next
non-empty line right before that line; and its line endings are the document's.
"""

from __future__ import annotations

import re

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from diffgemma_lsp.postprocess import Edit, postprocess, postprocess_replacement
from diffgemma_lsp.postprocess.cursor import CLOSING_CHARS

LANGUAGE_IDS = ["python", "javascript", "typescriptreact", "go", "rust", "c", "cpp", "lua", "yaml", ""]
PIECES = [
    *"ab_x1 \t()[]{}'\"`;,:#/*-=.\\",
    "\n",
    "\r\n",
    "\r",
    "    ",
    "\t",
    "def ",
    "if ",
    " then",
    " do",
    "end",
    "until",
    "function ",
    "return ",
    "else:",
    "//",
    "/*",
    "*/",
    '"""',
    "--[[",
    "]]",
    'r#"',
    "'a",
]
LINES = [
    "def f(x):",
    "    return x",
    "    if x:",
    "        pass",
    "    else:",
    "}",
    "  }",
    "});",
    "if (a) {",
    "\tfoo();",
    "  bar(1, 2);",
    "end",
    "local function g()",
    "x = 1",
    "",
    "    ",
    ")",
    "]",
    "  return [",
    "fn main() {",
]
SETTINGS = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])

code = st.lists(st.sampled_from(PIECES), max_size=40).map("".join)
anything = st.one_of(code, st.text(max_size=60))


@st.composite
def documents(draw: st.DrawFn) -> tuple[str, str, str, str]:
    """Line-structured documents whose raw completions often repeat the suffix's lines."""
    newline = draw(st.sampled_from(["\n", "\r\n"]))
    before = draw(st.lists(st.sampled_from(LINES), max_size=6))
    after = draw(st.lists(st.sampled_from(LINES), max_size=6))
    head, tail = draw(st.sampled_from(LINES)), draw(st.sampled_from(LINES))
    cut = draw(st.integers(0, len(head)))
    rest_cut = draw(st.integers(0, len(tail)))
    prefix = newline.join([*before, head[:cut]])
    suffix = newline.join([tail[rest_cut:], *after])
    raw_lines = draw(st.lists(st.sampled_from(LINES + after + after + [tail, tail[rest_cut:]]), max_size=8))
    raw = draw(st.sampled_from(["", "\n"])) + "\n".join(raw_lines) + draw(st.sampled_from(["", "\n"]))
    return prefix, suffix, raw, draw(st.sampled_from(LANGUAGE_IDS))


def lines_of(text: str) -> list[str]:
    """Lines as LSP counts them (CRLF, CR and LF all end a line)."""
    return re.split(r"\r\n|\r|\n", text)


def rest_of_line(suffix: str) -> str:
    return lines_of(suffix)[0]


def apply(prefix: str, suffix: str, edit: Edit) -> str:
    """The document after the edit, as the server applies it."""
    if edit.replace_to_eol:
        return prefix + edit.text + suffix[len(rest_of_line(suffix)) :]
    return prefix + edit.text + suffix


def check(prefix: str, suffix: str, raw: str, language_id: str) -> None:
    edit = postprocess(prefix, suffix, raw, language_id)
    if edit is None:
        return
    assert edit.text.strip(), "an empty completion must be None"
    rest = rest_of_line(suffix)
    document = apply(prefix, suffix, edit)
    # Outside its range nothing changes: the prefix, and the suffix after the replaced part of the line.
    assert document.startswith(prefix)
    kept = suffix[len(rest) :] if edit.replace_to_eol else suffix
    assert document.endswith(kept)
    if edit.replace_to_eol:
        # Only closing characters are replaced, and they are all still there after the edit.
        assert rest.strip() and all(char in CLOSING_CHARS or char in " \t" for char in rest)
        assert edit.text.endswith(rest.rstrip())
    # Line endings follow the document.
    breaks = set(re.findall(r"\r\n|\r|\n", prefix + suffix))
    if breaks == {"\r\n"}:
        assert "\n" not in edit.text.replace("\r\n", "")
        assert "\r" not in edit.text.replace("\r\n", "")
    elif breaks <= {"\n"}:
        assert "\r" not in edit.text
    # No suffix duplication: the last line the edit writes is not a copy of the line that follows it, which is
    # the next non-empty line of the suffix when the cursor ends its line, or the rest of the cursor's line when
    # the edit ends with a line break before it.
    written = lines_of(lines_of(prefix)[-1] + edit.text)
    if edit.replace_to_eol:
        return
    if not rest.strip():
        following = next((line for line in lines_of(suffix)[1:] if line.strip()), None)
        if following is not None:
            assert [line for line in written if line.strip()][-1].rstrip() != following.rstrip()
    elif len(written) > 1 and not written[-1].strip():
        own = [line for line in written[:-1] if line.strip()]
        assert not own or own[-1].rstrip() != (written[-1] + rest).rstrip()


@SETTINGS
@given(prefix=anything, suffix=anything, raw=anything, language_id=st.sampled_from(LANGUAGE_IDS))
def test_any_text(prefix: str, suffix: str, raw: str, language_id: str) -> None:
    check(prefix, suffix, raw, language_id)


@SETTINGS
@given(documents())
def test_line_structured_documents(case: tuple[str, str, str, str]) -> None:
    check(*case)


@SETTINGS
@given(prefix=st.text(), suffix=st.text(), raw=st.text(), language_id=st.text(max_size=12))
def test_never_raises_on_any_unicode(prefix: str, suffix: str, raw: str, language_id: str) -> None:
    edit = postprocess(prefix, suffix, raw, language_id)
    assert edit is None or isinstance(edit, Edit)


# --- a rewrite's markers -------------------------------------------------------------------------------------

MARKERS = ["<SELECTION>", "</SELECTION>", "<CURSOR>"]
"""The chat prompt's markers: in the user's own text they are text like any other."""
plain = st.lists(st.sampled_from([piece for piece in PIECES if "`" not in piece]), max_size=30).map("".join)
marked = st.lists(st.sampled_from([*PIECES, *MARKERS, *MARKERS]), max_size=30).map("".join)


@SETTINGS
@given(
    prefix=plain,
    selection=marked,
    suffix=plain,
    wrapped=st.booleans(),
    language_id=st.sampled_from(LANGUAGE_IDS),
)
def test_a_rewrite_keeps_every_marker_of_the_selection(
    prefix: str, selection: str, suffix: str, wrapped: bool, language_id: str
) -> None:
    """An instruction model that writes the selection as it was, wrapped in the selection's markers or not: the
    replacement holds each marker as often as that of a model whose answers are never unwrapped (the wrapping goes,
    the user's text stays)."""
    raw = f"<SELECTION>{selection}</SELECTION>" if wrapped else selection
    text = postprocess_replacement(prefix, selection, suffix, raw, language_id, instruct=True)
    plain_text = postprocess_replacement(prefix, selection, suffix, selection, language_id)  # markers: plain text
    assert [(text or "").count(marker) for marker in MARKERS] == [(plain_text or "").count(m) for m in MARKERS]
