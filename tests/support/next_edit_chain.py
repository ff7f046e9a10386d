"""The next-edit chain every chain test uses (issue 45, part 3): a function renamed at its definition, then its three
uses below made to follow, one Tab each."""

from __future__ import annotations

from diffgemma_engine.shared import protocol
from diffgemma_lsp.document import LineDocument
from diffgemma_lsp.features.next_edit import next_edit_request
from diffgemma_lsp.jumps import chain_request, chain_settings, places, renamed
from diffgemma_lsp.settings import Settings
from tests.support.next_edits import first_line_edited

CHAIN = "".join(
    ["def total(items):\n", "    return sum(items)\n", "\n\n", "first = total([1, 2])\n"]
    + ["second = total([3, 4])\n", "third = total([5, 6])\n"]
)
RENAMED = CHAIN.replace("def total(", "def summed(")
"""After the user's edit: the function renamed where it is defined, its three uses not yet."""
STEPS = [
    RENAMED.replace("first = total", "first = summed"),
    RENAMED.replace("first = total", "first = summed").replace("second = total", "second = summed"),
    RENAMED.replace("total(", "summed("),
]
"""The document after each Tab of the chain: the uses follow the rename one by one, in order."""
PLACE_LINES = [4, 5, 6]
"""The lines of the three uses (0-based)."""
FOLLOWED_LINES = ["first = summed([1, 2])\n", "second = summed([3, 4])\n", "third = summed([5, 6])\n"]
"""What the model writes for each place's window (the place's line)."""
CHAIN_NAME = "totals.py"


def chain_requests(uri: str, settings: Settings | None = None) -> list[protocol.Infill]:
    """What the language server asks the engine for the chain once the rename was typed into ``CHAIN``: one
    request whose own window is the first use and whose ``windows`` are the other two (``chain_request``), with the
    rename in the edit history once the typing has paused (``BURST_GAP_S``), and without it before: two requests.
    Built by the server's own edit history, rename finder and next-edit request."""
    settings = settings or Settings()
    before, after = CHAIN.splitlines(keepends=True), RENAMED.splitlines(keepends=True)
    rename = renamed(before[:1], after[:1])
    assert rename is not None and rename.old == "total", rename
    assert places(after, rename.old, range(0, 1)) == PLACE_LINES
    document = LineDocument(uri, RENAMED, version=2, language_id="python")
    requests = []
    for extra in first_line_edited(uri, CHAIN, RENAMED, settings):
        asked = [next_edit_request(document, line, chain_settings(settings), 0, extra, "chain") for line in PLACE_LINES]
        requests.append(chain_request([pair[1] for pair in asked if pair is not None]))
    return requests
