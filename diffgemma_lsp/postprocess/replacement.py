"""The pipeline adapted to a replacement: the text a rewrite puts in a selection's place.

:func:`postprocess_replacement` sees the document as an insertion would with the selection taken out (``prefix``
then ``suffix``), the selection, and the model's text for it. The filters run on LF text, in this order:

0. With ``instruct=True``: :func:`unwrap_replacement`, as for an insertion (a fence, an echoed prefix), with the
   selection's markers of the chat turn (``<SELECTION>``, ``</SELECTION>``) dropped only where the model echoed
   them around its answer: a marker the selection itself holds is the user's text, and stays.
1. :func:`normalise`.
2. :func:`fit_to_selection`: the indentation is the selection's, not the block's: the lines move together so that
   the first one that starts a document line sits where the selection's does.
3. The cuts of an insertion (steps 3 to 5 of the pipeline: the repeat of what follows, the end of the cursor's
   block, a string left open, a closer the suffix provides) apply only where they leave the selection itself
   whole. A cut the selection would get too is no sign that the model ran on: a selection that spans two
   functions may be replaced by two functions.
4. Trailing whitespace on each line, as in step 6.
5. The whitespace at both ends is the selection's: the model's own is replaced by the selection's leading and
   trailing whitespace (its line breaks and the indentation of its first line), so the text around the selection
   keeps its lines and columns whatever the model wrote there.

Step 8 (closers at the end of the line) has no counterpart: a replacement never replaces past the selection.
A blank selection is filled as an insertion at its place (its answer unwrapped as in step 0).
"""

from __future__ import annotations

from collections.abc import Callable

from diffgemma_lsp.postprocess.answer import unwrap_replacement
from diffgemma_lsp.postprocess.brackets import balance_brackets
from diffgemma_lsp.postprocess.confidence import Scored
from diffgemma_lsp.postprocess.cursor import Cursor, make_cursor, normalise
from diffgemma_lsp.postprocess.indentation import fit_to_selection
from diffgemma_lsp.postprocess.pipeline import newline_of, postprocess
from diffgemma_lsp.postprocess.repeats import trim_suffix_overlap
from diffgemma_lsp.postprocess.scope import limit_scope, stop_before_open_string

Filter = Callable[[str, Cursor], str]
CUTS: tuple[Filter, ...] = (trim_suffix_overlap, limit_scope, stop_before_open_string, balance_brackets)
"""The filters that end an insertion early, in the pipeline's order."""
BLANKS = " \t\n"


def postprocess_replacement(
    prefix: str, selection: str, suffix: str, raw: str, language_id: str, *, instruct: bool = False
) -> str | None:
    """The text to put in place of ``selection`` (between ``prefix`` and ``suffix``) for the model's ``raw``
    answer, in the document's line endings; None if nothing is left (:func:`scored_replacement`'s text)."""
    scored = scored_replacement(prefix, selection, suffix, Scored(raw), language_id, instruct=instruct)
    return None if scored is None else scored.text


def scored_replacement(
    prefix: str, selection: str, suffix: str, raw: Scored, language_id: str, *, instruct: bool = False
) -> Scored | None:
    """:func:`postprocess_replacement` with the model's confidence in each character carried to the replacement."""
    scored = raw
    if instruct:  # the rewrite's prompt has no cursor marker: any "<CURSOR>" in the answer is text
        scored = scored.then(unwrap_replacement(scored.text, prefix, selection, suffix))
    if not selection.strip():
        edit = postprocess(prefix, suffix, scored.text, language_id, confidence=scored.confidence)
        return edit.scored.then(edit.insertion(suffix)) if edit is not None else None
    original = normalise(selection)
    cursor = make_cursor(prefix, suffix, scored.text, language_id)
    scored = scored.then(normalise(scored.text))
    scored = scored.then(fit_to_selection(scored.text, original, cursor))
    for cut in cuts_passed_by(original, prefix, suffix, language_id):
        scored = scored.then(cut(scored.text, cursor))
    core = "\n".join(line.rstrip() for line in scored.text.split("\n")).strip(BLANKS)
    if not core:
        return None
    lead = original[: len(original) - len(original.lstrip(BLANKS))]
    trail = original[len(original.rstrip(BLANKS)) :]
    scored = scored.then(lead + core + trail)
    return scored.then(scored.text.replace("\n", newline_of(prefix, suffix + selection)))


def cuts_passed_by(selection: str, prefix: str, suffix: str, language_id: str) -> list[Filter]:
    """The cuts that leave ``selection`` (LF) whole where it stands, in order: those that may cut its replacement."""
    cursor = make_cursor(prefix, suffix, selection, language_id)
    return [cut for cut in CUTS if cut(selection, cursor).strip(BLANKS) == selection.strip(BLANKS)]
