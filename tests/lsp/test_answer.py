"""Unit tests of diffgemma_lsp.postprocess.answer: each step of unwrapping an instruction-tuned model's answer, and
properties."""

from __future__ import annotations

from hypothesis import assume, given
from hypothesis import strategies as st

from diffgemma_lsp.postprocess.answer import CURSOR_MARK, remove_marker, strip_fence, strip_prefix_echo, unwrap_answer

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
    assert remove_marker(f"    return {CURSOR_MARK}a + b", "\n") == "    return a + b"
    assert remove_marker(f"a + b{CURSOR_MARK}", "") == "a + b"
    assert remove_marker("no marker", "") == "no marker"


def test_an_echo_of_the_suffix_after_the_marker_goes() -> None:
    suffix = "\n\nprint(add(1, 2))\n"
    assert remove_marker(f"    return a + b{CURSOR_MARK}\n\nprint(add(1, 2))", suffix) == "    return a + b"
    assert remove_marker(f"    return a + b{CURSOR_MARK}\n\n  print(add(1,", suffix) == "    return a + b"
    # The model's own text after the marker stays, even followed by the suffix (the filters cut that).
    assert remove_marker(f"x = {CURSOR_MARK}1\nprint(x)", "\nprint(x)") == "x = 1\nprint(x)"


def test_a_second_marker_goes_too() -> None:
    assert remove_marker(f"a{CURSOR_MARK}b{CURSOR_MARK}c", "") == "abc"


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


@given(prefix=st.lists(PIECES).map("".join), suffix=st.lists(PIECES).map("".join), answer=st.lists(PIECES).map("".join))
def test_any_answer_unwraps_without_a_marker_left(prefix: str, suffix: str, answer: str) -> None:
    assert CURSOR_MARK not in unwrap_answer(answer, prefix, suffix)
