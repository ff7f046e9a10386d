"""Unit tests of diffgemma_lsp.postprocess.answer: each step of unwrapping an instruction-tuned model's answer, and
properties."""

from __future__ import annotations

from hypothesis import assume, given
from hypothesis import strategies as st

from diffgemma_lsp.postprocess.answer import (
    CURSOR_MARK,
    SELECTION_CLOSE,
    SELECTION_OPEN,
    remove_marker,
    remove_wrapping,
    strip_fence,
    strip_prefix_echo,
    unwrap_answer,
    unwrap_replacement,
)

# --- fences -------------------------------------------------------------------------------------------------


def test_fence_with_a_language_tag_keeps_its_body() -> None:
    assert strip_fence("```python\ndef f():\n    return 1\n```") == "def f():\n    return 1"


def test_fence_without_a_tag_and_tilde_fences() -> None:
    assert strip_fence("```\nx = 1\n```\n") == "x = 1"
    assert strip_fence("~~~ lua\nx = 1\n~~~") == "x = 1"


def test_text_before_and_after_the_first_block_goes() -> None:
    answer = "Here is the code:\n\n```js\nf();\n```\n\nIt calls f.\n```js\ng();\n```"
    assert strip_fence(answer) == "f();"


def test_an_unclosed_fence_keeps_everything_after_its_opening_line() -> None:
    assert strip_fence("```python\n    a = 1\n    b = 2\n") == "    a = 1\n    b = 2\n"
    assert strip_fence("```python") == ""


def test_only_a_matching_closing_fence_closes() -> None:
    # Tildes do not close backticks, a shorter fence does not close a longer one, a tagged line is no closer.
    assert strip_fence("````\na\n```\nb\n```python\n````\nafter") == "a\n```\nb\n```python"
    assert strip_fence("```\na\n~~~\n```") == "a\n~~~"
    assert strip_fence("```\na\n```   \nb") == "a"


def test_the_fence_keeps_only_its_own_line_breaks() -> None:
    assert strip_fence("```\n\nx = 1\n\n```") == "\nx = 1\n"
    assert strip_fence("```\n```") == ""


def test_crlf_answer() -> None:
    assert strip_fence("Sure:\r\n```python\r\na = 1\r\nb = 2\r\n```\r\nDone.") == "a = 1\r\nb = 2"


def test_what_is_not_a_fence() -> None:
    assert strip_fence("x = '```'\n") == "x = '```'\n"  # not at the start of a line
    assert strip_fence("```inline```\nx") == "```inline```\nx"  # backticks in the info string: inline code
    assert strip_fence('    """\n    ```\n    x\n    ```\n    """') == '    """\n    ```\n    x\n    ```\n    """'


# --- cursor marker ------------------------------------------------------------------------------------------


def test_the_marker_goes() -> None:
    prefix = "def add(a, b):\n    return "
    assert remove_marker(f"    return {CURSOR_MARK}a + b", prefix, "\n") == "    return a + b"
    assert remove_marker(f"{CURSOR_MARK}a + b", prefix, "\n") == "a + b"
    assert remove_marker(f"a + b{CURSOR_MARK}", prefix, "") == "a + b"
    assert remove_marker("no marker", prefix, "") == "no marker"


def test_an_echo_of_the_suffix_after_the_marker_goes() -> None:
    prefix, suffix = "def add(a, b):\n", "\n\nprint(add(1, 2))\n"
    assert remove_marker(f"    return a + b{CURSOR_MARK}\n\nprint(add(1, 2))", prefix, suffix) == "    return a + b"
    assert remove_marker(f"    return a + b{CURSOR_MARK}\n\n  print(add(1,", prefix, suffix) == "    return a + b"
    # The model's own text after the marker stays, even followed by the suffix (the filters cut that).
    assert remove_marker(f"x = {CURSOR_MARK}1\nprint(x)", "x = ", "\nprint(x)") == "x = 1\nprint(x)"


def test_a_marker_in_the_models_own_code_is_text_where_the_code_holds_one() -> None:
    """Where the code holds the marker's string (this project's prompt code does), only the echoed marker goes: the
    first one where the answer meets the code around the cursor. One inside the model's own code stays."""
    prefix, suffix = f'MARK = "{CURSOR_MARK}"\n\ndef mark(text):\n    return ', "\n"
    assert remove_marker(f"a{CURSOR_MARK}b{CURSOR_MARK}c", prefix, suffix) == f"a{CURSOR_MARK}b{CURSOR_MARK}c"
    assert remove_marker(f"a{CURSOR_MARK}b{CURSOR_MARK}", prefix, suffix) == f"a{CURSOR_MARK}b"  # the last: at the end
    answer = f'{CURSOR_MARK}text.replace("{CURSOR_MARK}", "")'
    assert remove_marker(answer, prefix, suffix) == f'text.replace("{CURSOR_MARK}", "")'
    assert remove_marker(f'text.replace("{CURSOR_MARK}", "")', prefix, suffix) == f'text.replace("{CURSOR_MARK}", "")'


def test_every_marker_goes_where_the_code_holds_none() -> None:
    """The code the model was shown holds no marker: every one in its answer is the model's."""
    prefix, suffix = "def mark(text):\n    return ", "\n"
    assert remove_marker(f'{CURSOR_MARK}text.replace("{CURSOR_MARK}", "")', prefix, suffix) == 'text.replace("", "")'
    assert remove_marker(f"a{CURSOR_MARK}b{CURSOR_MARK}c", prefix, suffix) == "abc"


def test_a_marker_the_code_holds_at_the_cursor_is_the_users() -> None:
    """Where the prefix ends (or the suffix starts) with the marker itself, the answer's marker there echoes it."""
    prefix = f'MARK = "{CURSOR_MARK}'
    assert remove_marker(f'MARK = "{CURSOR_MARK}"', prefix, "\n") == f'MARK = "{CURSOR_MARK}"'
    suffix = f'{CURSOR_MARK}"\n'
    assert remove_marker(f'{CURSOR_MARK}"', 'MARK = "', suffix) == f'{CURSOR_MARK}"'


# --- the selection's markers (a rewrite) ----------------------------------------------------------------------


USERS_LINE = 'return "<SELECTION>" + text + "</SELECTION>"  # <CURSOR> marks the cursor'
"""A line of this project's own prompt code: every marker in it is the user's text."""


def test_a_rewrite_keeps_the_markers_of_the_users_text() -> None:
    prefix, suffix = "def mark(text):\n    ", "\n"
    assert unwrap_replacement(USERS_LINE, prefix, USERS_LINE, suffix) == USERS_LINE
    changed = USERS_LINE.replace("text", "body")
    assert unwrap_replacement(changed, prefix, USERS_LINE, suffix) == changed
    wrapped = f"{SELECTION_OPEN}{USERS_LINE}{SELECTION_CLOSE}"
    assert unwrap_replacement(wrapped, prefix, USERS_LINE, suffix) == USERS_LINE
    assert unwrap_replacement(f"```python\n{wrapped}\n```", prefix, USERS_LINE, suffix) == USERS_LINE


def test_the_wrapping_markers_go_with_an_echo_of_the_code_around() -> None:
    prefix, selection, suffix = "def add(a, b):\n", "    return a - b", "\n\nprint(add(1, 2))\n"
    answer = f"def add(a, b):\n{SELECTION_OPEN}    return a + b{SELECTION_CLOSE}\n\nprint(add(1, 2))"
    assert remove_wrapping(answer, prefix, selection, suffix) == "def add(a, b):\n    return a + b\n\nprint(add(1, 2))"
    # A selection that starts with a marker: the answer's first one is the model's, the next the user's.
    selection = f"{SELECTION_OPEN} = 1"
    answer = f"{SELECTION_OPEN}{SELECTION_OPEN} = 2{SELECTION_CLOSE}"
    assert remove_wrapping(answer, prefix, selection, suffix) == f"{SELECTION_OPEN} = 2"
    # A marker the model wrote inside its code, with no more of them than the selection: all stay.
    assert remove_wrapping(f"a{SELECTION_CLOSE}b", prefix, f"x{SELECTION_CLOSE}y", suffix) == f"a{SELECTION_CLOSE}b"


# --- repeat of the prefix -----------------------------------------------------------------------------------


def test_the_cursors_partial_line_is_stripped_with_or_without_its_indentation() -> None:
    prefix = "def add(a, b):\n    return "
    assert strip_prefix_echo("return a + b", prefix) == "a + b"
    assert strip_prefix_echo("    return a + b", prefix) == "a + b"
    assert strip_prefix_echo("return(a + b)", prefix) == "(a + b)"  # no space after the keyword
    assert strip_prefix_echo("x = foo(a, b)", "x = foo(") == "a, b)"
    assert strip_prefix_echo("return max(a, b)", "    ret") == "urn max(a, b)"


def test_whole_prefix_lines_are_stripped() -> None:
    assert strip_prefix_echo("def add(a, b):\n    return a + b", "def add(a, b):\n") == "    return a + b"
    assert strip_prefix_echo("def add(a, b):\n    return a + b", "def add(a, b):\n    ") == "return a + b"
    prefix = "import os\n\ndef main():\n    path = os.getcwd()\n    "
    assert strip_prefix_echo("def main():\n    path = os.getcwd()\n    print(path)", prefix) == "print(path)"
    assert strip_prefix_echo("def add(a, b):  \r\n    return a + b\r\n", "def add(a, b):\r\n") == "    return a + b\r\n"


def test_the_longest_repeat_wins() -> None:
    prefix = "x = 1\nx = 1\n"
    assert strip_prefix_echo("x = 1\nx = 1\ny = 2", prefix) == "y = 2"


def test_a_dedented_echo_gets_its_indentation_back() -> None:
    prefix = "class A:\n    def f(self):\n        "
    assert strip_prefix_echo("def f(self):\n    x = 1\n    return x", prefix) == "x = 1\n        return x"
    prefix = "class A:\n    def f(self):\n        return ("
    assert strip_prefix_echo("def f(self):\n    return (\n        1\n    )", prefix) == "\n            1\n        )"


def test_later_lines_must_be_reindented_like_the_first() -> None:
    prefix = "def f():\n    x = 1\n"
    assert strip_prefix_echo("def f():\nx = 1\ny = 2", prefix) == "def f():\nx = 1\ny = 2"


def test_nothing_is_stripped_without_a_whole_repeat() -> None:
    assert strip_prefix_echo("return_value", "    return ") == "return_value"
    assert strip_prefix_echo("line = line.lower()", "    line = line.strip()\n    ") == "line = line.lower()"
    assert strip_prefix_echo("x, y)", "x = foo(") == "x, y)"
    assert strip_prefix_echo("def add(a, b, c):\n    pass", "def add(a, b):\n") == "def add(a, b, c):\n    pass"


def test_a_repeat_of_blank_lines_only_is_not_stripped() -> None:
    assert strip_prefix_echo("\n    pass", "x = 1\n\n    ") == "\n    pass"
    assert strip_prefix_echo("    pass", "def f():\n    ") == "    pass"


def test_a_lone_closer_repeats_only_at_its_own_indentation() -> None:
    prefix = "function f() {\n  if (x) {\n  }\n"
    assert strip_prefix_echo("}", prefix) == "}"
    assert strip_prefix_echo("  }\n  return 1;", prefix) == "  return 1;"


def test_an_answer_that_is_only_a_repeat_becomes_empty() -> None:
    assert strip_prefix_echo("    return ", "def f():\n    return ") == ""
    assert strip_prefix_echo("def f():\n", "def f():\n") == ""


# --- all steps ----------------------------------------------------------------------------------------------


def test_unwrap_answer_runs_the_steps_in_order() -> None:
    prefix, suffix = "def add(a, b):\n    return ", "\n\nprint(add(1, 2))\n"
    answer = f"Here:\n```python\ndef add(a, b):\n    return {CURSOR_MARK}a + b\n\nprint(add(1, 2))\n```\nDone."
    assert unwrap_answer(answer, prefix, suffix) == "a + b\n\nprint(add(1, 2))"
    answer = f"```python\ndef add(a, b):\n    return a + b{CURSOR_MARK}\n\nprint(add(1, 2))\n```"
    assert unwrap_answer(answer, prefix, suffix) == "a + b"
    assert unwrap_answer(f"def add(a, b):\n    return {CURSOR_MARK}\n\nprint(add(1, 2))", prefix, suffix) == ""


PREFIX_TEXT = st.text(alphabet="abc(): \t\n", max_size=60)
ANSWER_TEXT = st.text(alphabet="xyz=[]+ \t\n\r", max_size=60)


@given(prefix=PREFIX_TEXT, suffix=PREFIX_TEXT, answer=ANSWER_TEXT)
def test_an_answer_with_nothing_to_unwrap_is_unchanged(prefix: str, suffix: str, answer: str) -> None:
    assert unwrap_answer(answer, prefix, suffix) == answer


@given(prefix=PREFIX_TEXT, body=ANSWER_TEXT)
def test_a_fenced_body_comes_back(prefix: str, body: str) -> None:
    assume(not body.endswith("\r"))  # it would make one CRLF line break with the fence's LF
    assert unwrap_answer(f"Here:\n```python\n{body}\n```\nThat is all.", prefix, "") == body


@given(prefix=PREFIX_TEXT, body=ANSWER_TEXT)
def test_an_echo_of_the_cursors_line_goes(prefix: str, body: str) -> None:
    cursor_line = prefix.rsplit("\n", 1)[-1]
    assume(cursor_line.strip())
    assert unwrap_answer(cursor_line + body, prefix, "") == body


PIECES = st.sampled_from(
    ["```", "~~~", "```py", CURSOR_MARK, "\n", "\r\n", "\r", "    ", "\t", "}", "x = 1", "def f():"]
)


@given(prefix=st.lists(PIECES).map("".join), suffix=st.lists(PIECES).map("".join), body=st.lists(PIECES).map("".join))
def test_a_marker_echoed_at_either_end_goes(prefix: str, suffix: str, body: str) -> None:
    assume(CURSOR_MARK not in prefix + suffix + body)
    assert CURSOR_MARK not in unwrap_answer(CURSOR_MARK + body, prefix, suffix)
    assert CURSOR_MARK not in unwrap_answer(body + CURSOR_MARK, prefix, suffix)


@given(prefix=PREFIX_TEXT, suffix=PREFIX_TEXT, before=ANSWER_TEXT, after=ANSWER_TEXT)
def test_a_marker_inside_the_models_own_code_stays_where_the_code_holds_one(
    prefix: str, suffix: str, before: str, after: str
) -> None:
    """Code neither side of which is an echo of the code around the cursor (other letters), in a file that holds
    the marker's string: the marker is text."""
    assume(before.strip() and after.strip())
    answer = before + CURSOR_MARK + after
    assert unwrap_answer(answer, f'MARK = "{CURSOR_MARK}"\n' + prefix, suffix) == answer


@given(prefix=st.lists(PIECES).map("".join), suffix=st.lists(PIECES).map("".join), answer=st.lists(PIECES).map("".join))
def test_no_marker_is_left_where_the_code_holds_none(prefix: str, suffix: str, answer: str) -> None:
    assume(CURSOR_MARK not in prefix + suffix)
    assert CURSOR_MARK not in unwrap_answer(answer, prefix, suffix)
