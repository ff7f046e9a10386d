"""The next-edit example every next-edit test uses: a parameter renamed, then its use below made to follow."""

from __future__ import annotations

from diffgemma_engine.shared import protocol
from diffgemma_engine.shared.prompt import EDITS_CHUNK_NAME
from diffgemma_lsp.context import CHARS_PER_TOKEN
from diffgemma_lsp.document import LineDocument
from diffgemma_lsp.edit_history import BURST_GAP_S, EditHistory, render
from diffgemma_lsp.extra_context import file_name
from diffgemma_lsp.features.next_edit import next_edit_request
from diffgemma_lsp.settings import Settings

AREA = "def area(width, height):\n    return width * height\n\n\nprint(area(2, 3))\n"
RENAMED = AREA.replace("area(width,", "area(size,")
"""After the user's edit: the parameter renamed, its use not yet."""
FOLLOWED = RENAMED.replace("return width", "return size")
"""After the next edit: the use follows the rename."""
AREA_NAME = "area.py"
"""The file's name: the edit history names it."""


def first_line_edited(uri: str, before: str, after: str, settings: Settings) -> list[list[protocol.Chunk]]:
    """What a next edit's prompt holds besides the code once the first line of ``before`` was typed into ``after``'s
    (the server's own edit history): nothing while the typing goes on, then the edit, once it has paused
    (``BURST_GAP_S``)."""
    now = 0.0
    history = EditHistory(clock=lambda: now)
    old, new = before.splitlines(keepends=True), after.splitlines(keepends=True)
    history.replaced(uri, 0, old[:1], new[:1], old)
    now = BURST_GAP_S
    hunks = history.recent(lambda _: new, settings.edit_history_tokens * CHARS_PER_TOKEN)
    assert len(hunks) == 1, hunks
    return [[], [protocol.Chunk(filename=EDITS_CHUNK_NAME, text=render(hunks, file_name))]]


def next_edit_requests(uri: str) -> list[protocol.Infill]:
    """What the language server asks the engine (default settings, no other files) for the next edit anywhere in
    ``RENAMED`` at ``uri`` once the rename was typed into ``AREA``: a rewrite of the window (the whole file) from its
    text, a share renoised; its edit history holds the rename once the typing has paused (``BURST_GAP_S``), and
    nothing before. Built by the server's own edit history and request (``next_edit_request``)."""
    settings = Settings()
    document = LineDocument(uri, RENAMED, version=2, language_id="python")
    requests = []
    for extra in first_line_edited(uri, AREA, RENAMED, settings):
        asked = next_edit_request(document, 0, settings, 0, extra, "next-edit")
        assert asked is not None
        requests.append(asked[1])
    return requests
