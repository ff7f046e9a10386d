"""The pipeline: run the filters in order on the model's text and turn what is left into an :class:`Edit`.

The order and why it is so are in the package's docstring (:mod:`diffgemma_lsp.postprocess`). The two small
steps that only tidy the result live here: trailing whitespace (step 6) and ending whole lines before the rest
of the cursor's line (step 7).
"""

from __future__ import annotations

import attrs

from diffgemma_lsp.postprocess.answer import unwrap_answer
from diffgemma_lsp.postprocess.brackets import balance_brackets, fit_closers
from diffgemma_lsp.postprocess.confidence import Scored, confident_part
from diffgemma_lsp.postprocess.cursor import Cursor, make_cursor, normalise
from diffgemma_lsp.postprocess.indentation import fit_indentation
from diffgemma_lsp.postprocess.repeats import stop_before_repeated_line, trim_suffix_overlap
from diffgemma_lsp.postprocess.scope import limit_scope, stop_before_open_string


@attrs.frozen(kw_only=True)
class Edit:
    """What to put at the cursor."""

    text: str
    """The text to insert at the cursor, in the document's line endings."""
    replace_to_eol: bool
    """True when ``text`` also replaces the rest of the cursor's line (which holds only closing characters)."""
    confidence: tuple[float, ...] | None = None
    """The model's confidence in each character of ``text`` (``postprocess.confidence``); None: not known."""

    @property
    def scored(self) -> Scored:
        """``text`` with its confidences."""
        return Scored(self.text, self.confidence)

    def replaced(self, suffix: str) -> str:
        """What of ``suffix`` (the text after the cursor) the edit replaces: the rest of the cursor's line, before
        its line break, when ``replace_to_eol``; else nothing."""
        return suffix.split("\n", 1)[0].rstrip("\r") if self.replace_to_eol else ""

    def insertion(self, suffix: str) -> str:
        """The text to insert at the cursor where nothing can be replaced: without the closers that
        ``replaced`` would have replaced, since they are already after the cursor."""
        rest = self.replaced(suffix).rstrip()
        return self.text[: len(self.text) - len(rest)] if rest and self.text.endswith(rest) else self.text


def postprocess(
    prefix: str,
    suffix: str,
    raw: str,
    language_id: str,
    *,
    instruct: bool = False,
    confidence: tuple[float, ...] | None = None,
) -> Edit | None:
    """The edit to offer for the model's ``raw`` middle between ``prefix`` and ``suffix``; None if nothing is left.

    ``instruct`` says ``raw`` is an instruction-tuned model's answer, which is unwrapped first (step 0).
    ``confidence`` (one per character of ``raw``) is carried through every step to the edit's characters.
    """
    scored = Scored(raw, confidence)
    if instruct:
        scored = scored.then(unwrap_answer(scored.text, prefix, suffix))
    cursor = make_cursor(prefix, suffix, scored.text, language_id)
    scored = scored.then(normalise(scored.text))
    filters = (fit_indentation, trim_suffix_overlap, limit_scope, stop_before_open_string, balance_brackets)
    for step in (*filters, trim_whitespace):
        scored = scored.then(step(scored.text, cursor))
    for last in (end_before_rest, stop_before_repeated_line, trim_whitespace):
        scored = scored.then(last(scored.text, cursor))
    if not scored.text.strip():
        return None
    text, replace = fit_closers(scored.text, cursor)
    scored = scored.then(text).then(text.replace("\n", newline_of(prefix, suffix)))
    return Edit(text=scored.text, replace_to_eol=replace, confidence=scored.confidence)


def gated(edit: Edit, minimum: float) -> Edit | None:
    """``edit`` cut to the part the model is sure of (``confidence.confident_part``; a cut one replaces nothing past
    the cursor), or None when its start is unsure: the suggestion is withheld."""
    part = confident_part(edit.scored, minimum)
    if part is None:
        return None
    if part.text == edit.text:
        return edit
    return Edit(text=part.text, replace_to_eol=False, confidence=part.confidence)


def newline_of(prefix: str, suffix: str) -> str:
    """The document's line break: CRLF where most of its line breaks are, else LF."""
    text = prefix + suffix
    crlf = text.count("\r\n")
    return "\r\n" if crlf and crlf >= text.count("\n") - crlf else "\n"


# --- 6. whitespace -----------------------------------------------------------------------------------------


def trim_whitespace(text: str, cursor: Cursor) -> str:
    """Trailing whitespace on each line and trailing blank lines, except what the rest of the line needs.

    When the rest of the cursor's line is not blank it follows the completion's last line, so that line keeps
    its trailing spaces, and a final line break (with the indentation after it) stays.
    """
    lines = text.split("\n")
    if not cursor.rest.strip():
        return "\n".join(line.rstrip() for line in lines).rstrip()
    lines[:-1] = [line.rstrip() for line in lines[:-1]]
    if lines[-1].strip() and cursor.rest[:1] in (" ", "\t"):
        lines[-1] = lines[-1].rstrip(" \t")
    if len(lines) > 1 and not lines[-1].strip():
        while len(lines) > 2 and not lines[-2]:
            del lines[-2]
    return "\n".join(lines)


# --- 7. whole lines before the rest of the line ------------------------------------------------------------


def end_before_rest(text: str, cursor: Cursor) -> str:
    """When whole lines go in before the text after the cursor, end them with a line break and the indentation
    that text had, so it keeps its line and its column."""
    if not cursor.inserts_lines:
        return text
    lines = text.split("\n")
    if len(lines) > 1 and not lines[-1].strip():
        lines.pop()
    return "\n".join([*lines, cursor.line_before])
