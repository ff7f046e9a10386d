"""Turn a completion text into LSP items: a completion-menu item and an inline (ghost text) item, the latter with
the model's confidence in its characters where known (``data.confidence``, an addition clients may ignore)."""

from __future__ import annotations

from typing import Any

import attrs
from cattrs import Converter
from lsprotocol import types
from pygls.protocol import default_converter

from diffgemma_lsp.context import InfillContext
from diffgemma_lsp.postprocess.confidence import Scored

LABEL_MAX = 60
DETAIL = "diffgemma"


def escape_snippet(text: str) -> str:
    """Escape ``\\``, ``$`` and ``}`` so a snippet inserts ``text`` literally."""
    return text.replace("\\", "\\\\").replace("$", "\\$").replace("}", "\\}")


def label_for(text: str) -> str:
    """A short one-line label: the first non-empty line of ``text``."""
    first = next((line.strip() for line in text.splitlines() if line.strip()), "")
    return first if len(first) <= LABEL_MAX else first[: LABEL_MAX - 1] + "…"


def completion_item(context: InfillContext, text: str, snippets: bool, invoked: bool = False) -> types.CompletionItem:
    """One menu item that replaces the word before the cursor by that word plus the completion.

    The text goes as a snippet (escaped, so it inserts literally) wherever the client supports snippets, one line or
    many: Neovim inserts a plain-text edit as its first word (0.11) or first line (0.12) and applies nothing more,
    while a snippet's whole text is expanded. Only an item the user asked for (``invoked``) is preselected: a menu
    that opens while they type must not commit anything on their next key.
    """
    new_text = context.word + text
    multi_line = "\n" in text
    edit = types.TextEdit(
        range=types.Range(start=context.word_start, end=context.replace_end or context.position),
        new_text=escape_snippet(new_text) if snippets else new_text,
    )
    label = label_for(new_text) or label_for(text) or "…"
    return types.CompletionItem(
        label=label,
        kind=types.CompletionItemKind.Snippet if multi_line else types.CompletionItemKind.Text,
        detail=DETAIL,
        documentation=types.MarkupContent(kind=types.MarkupKind.Markdown, value=f"```\n{new_text}\n```"),
        filter_text=new_text.split("\n", 1)[0] or context.word,
        insert_text_format=types.InsertTextFormat.Snippet if snippets else types.InsertTextFormat.PlainText,
        text_edit=edit,
        sort_text="0",
        preselect=invoked or None,
    )


@attrs.define
class ScoredInlineItem(types.InlineCompletionItem):
    """An inline item and, in ``data``, the model's confidence in its characters: ``{"confidence": [[n, p], ...]}``,
    runs of ``n`` characters (code points of ``insert_text``) at confidence ``p`` (two decimals). LSP has no such
    field on inline items; clients ignore properties they do not know (VS Code, Neovim's own ghost text), and the
    Neovim plugin's own ghost text draws the unsure characters dimmer (editors/neovim/lua/diffgemma/ghost.lua)."""

    data: dict[str, Any] | None = None


def confidence_runs(confidence: tuple[float, ...]) -> list[list[float]]:
    """``confidence`` (one per character) as runs ``[n, p]`` of equal confidence, rounded to two decimals."""
    runs: list[list[float]] = []
    for p in confidence:
        rounded = round(p, 2)
        if runs and runs[-1][1] == rounded:
            runs[-1][0] += 1
        else:
            runs.append([1, rounded])
    return runs


def inline_item(context: InfillContext, scored: Scored) -> types.InlineCompletionItem:
    """Ghost text at the cursor; it may replace closing characters to the end of the line (one line, as LSP
    3.18 requires). With its characters' confidence in ``data`` where known (:class:`ScoredInlineItem`)."""
    return ScoredInlineItem(
        insert_text=scored.text,
        range=types.Range(start=context.position, end=context.replace_end or context.position),
        data=None if scored.confidence is None else {"confidence": confidence_runs(scored.confidence)},
    )


def converter() -> Converter:
    """pygls's converter, sending a :class:`ScoredInlineItem`'s ``data`` too (lsprotocol's own hook for inline items
    knows only their LSP fields)."""
    out: Converter = default_converter()  # type: ignore[no-untyped-call]  # pygls does not annotate it
    lsp_fields = out.get_unstructure_hook(types.InlineCompletionItem)

    def unstructure(item: types.InlineCompletionItem) -> Any:
        wire = lsp_fields(item)
        if isinstance(item, ScoredInlineItem) and item.data is not None:
            wire["data"] = item.data
        return wire

    out.register_unstructure_hook(types.InlineCompletionItem, unstructure)
    return out
