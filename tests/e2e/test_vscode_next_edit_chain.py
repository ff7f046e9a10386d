"""Issue 45, next edits that jump, in real VS Code (code-server 4.100.3 in headless Chromium, the packaged extension,
the real language server and engine): a function renamed at its definition, then its three uses renamed with three
Tabs, each drawn at its place away from the cursor ("Tab: line N" hinted at the cursor), and each Tab taking the
cursor to the place it edits.

The engine runs the checkpoint trained for this chain (``build_next_edit_chain``). That the 2nd and 3rd places were
computed before they were asked for is read from the engine's own request log as the driver saw it before each Tab:
one request of three windows, and no other. One code-server session and one engine serve the module's tests (the
driver's report of that run is what each asserts on); the harness is tests/e2e/test_vscode.py's."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import xdg_environment
from tests.e2e.test_vscode import _run_vscode, vscode_tools  # noqa: F401  (vscode_tools: the fixture)
from tests.support.next_edit_chain import CHAIN, CHAIN_NAME, FOLLOWED_LINES, PLACE_LINES, RENAMED, STEPS

pytestmark = pytest.mark.e2e
Run = tuple[dict, str]
"""The driver's report of the module's one session, and its JSON (to explain a failure)."""


@pytest.fixture(scope="module")
def chain_run(
    vscode_tools: tuple[str, str, list[str], str],  # noqa: F811
    next_edit_chain_model_dir: Path,
    module_tmp: Path,
) -> Iterator[Run]:
    """The module's one VS Code session: the rename typed, then a Tab for each place of the chain, saved."""
    scenario = {
        "scenario": "next-edit-chain",
        "renameAt": "1:5",  # the start of "total" in "def total(items):"
        "newName": "summed",
        "renamed": RENAMED,
        "steps": STEPS,
        "placeLines": PLACE_LINES,
        "engineLog": str(module_tmp / "xdg_state_home" / "diffgemma" / "engine.log"),
    }
    # nextEditLines 1: the window at the cursor (the definition) holds none of the uses, which are the chain's places.
    # Inline suggestions off: one shown while the rename is typed would hold the next edit back. No chunks of the
    # workspace index: the checkpoint learned the chain's prompts without them.
    settings = {
        "diffgemma.debounceMs": 0,
        "diffgemma.nextEditLines": 1,
        "diffgemma.repoContextTokens": 0,
        "editor.inlineSuggest.enabled": False,
    }
    with pytest.MonkeyPatch.context() as patch:
        for name, value in xdg_environment(module_tmp).items():  # the engine's log among them
            patch.setenv(name, value)
        report, explain, source = _run_vscode(
            vscode_tools, next_edit_chain_model_dir, module_tmp, CHAIN, scenario, settings, CHAIN_NAME
        )
    assert source.read_text() == STEPS[-1], explain
    yield report, explain


def test_three_tabs_apply_the_three_places_of_a_rename_each_a_jump_the_cursor_follows(chain_run: Run) -> None:
    report, explain = chain_run
    tabs = report["tabs"]
    assert [tab["text"] for tab in tabs] == STEPS, explain
    for tab, line, followed in zip(tabs, PLACE_LINES, FOLLOWED_LINES, strict=True):
        # the place drawn: its line struck through, its new text after it, the jump hinted at the cursor
        assert tab["drawing"]["struck"] == [CHAIN.splitlines()[line]], explain
        after = [text.strip() for text in tab["drawing"]["after"]]
        assert sorted(after) == sorted([f"Tab: line {line + 1}", followed.strip()]), explain
        assert not tab["cursor"].startswith(f"Ln {line + 1},"), explain  # shown away from the cursor: a jump
        assert tab["cursorAfter"].split(" (")[0] == f"Ln {line + 1}, Col 1", explain  # Tab took the cursor there
    assert report["drawingAfter"] == {"struck": [], "after": []}, explain  # the chain is done: nothing drawn
    assert report["saved"] == STEPS[-1], explain


def test_the_second_and_third_places_were_computed_in_the_first_requests_batch(chain_run: Run) -> None:
    report, explain = chain_run
    first, second, third = (tab["requests"] for tab in report["tabs"])
    assert len(first) == 1 and "(3 windows in one batch)" in first[0], explain
    assert second == third == first, explain  # no request since: the 2nd and 3rd were there when asked for
