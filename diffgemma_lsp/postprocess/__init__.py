"""Post-processing of the engine's raw middle: pure filters that make a completion land right.

:func:`postprocess` turns the model's text into an :class:`Edit` at the cursor. The filters work on LF text
and run in this order (line endings go back to the document's at the end); the module that holds each step is
named after it:

0. With ``instruct=True`` (an instruction-tuned model answering the chat prompt): :func:`unwrap_answer` first
   turns the answer into the text to insert: the body of its first code fence, without an echoed cursor marker
   or a repeat of the prefix's last lines at its start. (:mod:`.answer`)
1. :func:`normalise`: CRLF and CR to LF. (:mod:`.cursor`, which also builds the :class:`Cursor` the filters
   read the document from)
2. :func:`fit_indentation`: the first line takes the indentation of the cursor's block, later lines keep
   theirs (relative to it when the model was off by the same amount everywhere), tabs or spaces as the
   document uses them. (:mod:`.indentation`)
3. :func:`trim_suffix_overlap`: cut the end that repeats the rest of the cursor's line, and stop where the
   completion starts repeating the lines after the cursor. (:mod:`.repeats`)
4. :func:`limit_scope`: end a multi-line completion where the cursor's block (Python: function) ends; then
   :func:`stop_before_open_string`: stop before the line that opens a string or block comment the completion
   leaves open, when code follows the cursor (a dangling triple quote would turn that code into string text).
   (:mod:`.scope`)
5. :func:`balance_brackets`: drop a closing bracket (and what follows it) that the suffix already provides.
   (:mod:`.brackets`)
6. :func:`trim_whitespace`: trailing whitespace and trailing blank lines. (:mod:`.pipeline`)
7. :func:`end_before_rest`: whole lines inserted before the text after the cursor end with a line break, and
   the repeat check of step 3 runs once more on the final text (then step 6 again). (:mod:`.pipeline`)
8. :func:`fit_closers`: when the rest of the line is only closing characters, put a closing brace on its own
   line, and replace those characters (``replace_to_eol``) when the model wrote them itself. (:mod:`.brackets`)

Indentation comes before the overlap check because that check compares whole lines, indentation included;
scope comes before balancing so that a line closing the block is kept up to its closer, and the balancer then
decides from the suffix whether the closer stays. :mod:`.languages` holds what the filters know about each
language (comments, strings, blocks, indentation style) and the scanner that reads them; :mod:`.syntax` reads the
document around the cursor with the language's tree-sitter grammar where it parses, and the scanner inside its errors.
No pygls or torch here: the server builds the LSP items.

A rewrite's answer replaces a selection instead: :func:`postprocess_replacement` (:mod:`.replacement`) runs the
same filters adapted to that (the indentation fitted to the selection, the cuts only where the selection itself
passes them, the whitespace at both ends the selection's). :func:`infill_edits` (:mod:`.candidates`) runs
:func:`postprocess` on each candidate of a backend's answer.

Imports run one way: replacement -> pipeline -> indentation -> {scope, repeats, brackets} -> cursor -> syntax
-> languages
(pipeline and replacement also use each filter and answer directly).
"""

from diffgemma_lsp.postprocess.candidates import infill_edits
from diffgemma_lsp.postprocess.pipeline import Edit, postprocess
from diffgemma_lsp.postprocess.replacement import postprocess_replacement

__all__ = ["Edit", "infill_edits", "postprocess", "postprocess_replacement"]
