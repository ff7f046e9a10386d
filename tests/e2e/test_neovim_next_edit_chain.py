"""Issue 45, next edits that jump, in real Neovim 0.11, and 0.12 where ``DIFFGEMMA_NVIM012`` names one (``make
test-editors``; 0.12 also has inline completion and its insert-mode <Tab>): headless, the project's own plugin, the
real language server and engine. A function renamed at its definition, then its three uses renamed with three
<Tab>s, each one a jump to the next place (the hint at the cursor, the cursor taken there) and its edit.

The engine runs a checkpoint trained for this chain (``build_next_edit_chain``): the three places go to it in one
request, denoised in one batch, before the first is shown. That the 2nd and 3rd were computed before they were
asked for is read from the engine's own request log at each <Tab>: it holds the one request of three windows and no
other."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.e2e.test_neovim import any_nvim  # noqa: F401  (the fixture: each Neovim)
from tests.e2e.test_neovim_next_edit import PRELUDE, prepared, run_driver
from tests.support.lsp import server_command
from tests.support.next_edit_chain import CHAIN, CHAIN_NAME, FOLLOWED_LINES, PLACE_LINES, RENAMED, STEPS

pytestmark = pytest.mark.e2e

DRIVER = (
    PRELUDE
    + r"""
report.tabs = {}
-- The engine's request log: its next-edit requests (rewrites) so far, as it wrote them.
local function requests()
  if vim.fn.filereadable(cfg.engine_log) == 0 then return {} end
  return vim.tbl_filter(function(line) return line:find("a rewrite at strength", 1, true) ~= nil end,
    vim.fn.readfile(cfg.engine_log))
end

-- Each step: the plugin has asked by itself (after the last change) and shows the next place; record it, <Tab>.
local function step(index)
  if index > #cfg.steps then return finish(true) end
  poll("place " .. index, 30000, function()
    local shown = require("diffgemma").shown[vim.api.nvim_get_current_buf()]
    return #marks() > 0 and shown and shown
  end, function(shown)
    local hints = {}
    for _, mark in ipairs(marks()) do
      if mark[4].virt_text then table.insert(hints, { row = mark[2], text = mark[4].virt_text[1][1] }) end
    end
    table.insert(report.tabs, {
      jump = shown.jump, edits = vim.deepcopy(shown.edits), hints = hints,
      cursor = vim.api.nvim_win_get_cursor(0)[1] - 1, requests = requests(),
    })
    feed("<Tab>")
    poll("edit " .. index .. " applied", 5000, function() return text() == cfg.steps[index] end, function()
      report.tabs[index].cursor_after = vim.api.nvim_win_get_cursor(0)[1] - 1
      step(index + 1)
    end)
  end)
end

-- nextEditLines 1: the window at the cursor (the definition) holds none of the uses, which are the chain's places.
local settings = { debounceMs = 0, extraContextTokens = 0, nextEditLines = 1 }
start(settings, function()
  vim.api.nvim_win_set_cursor(0, { 1, 4 })
  vim.api.nvim_buf_set_text(0, 0, 4, 0, 9, { "summed" })
  log("renamed: %s", vim.api.nvim_buf_get_lines(0, 0, 1, false)[1])
  step(1)
end)
"""
)


async def test_neovim_applies_a_rename_chain_of_three_places_with_three_tabs_computed_in_one_batch(
    any_nvim: str,  # noqa: F811
    short_tmp: Path,
    next_edit_chain_model_dir: Path,
) -> None:
    nvim = any_nvim
    socket_path, source = prepared(short_tmp, CHAIN_NAME, CHAIN)
    report_path = short_tmp / "report.json"
    state = short_tmp / "state"
    cfg = {
        "file": str(source),
        "report": str(report_path),
        "steps": STEPS,
        "engine_log": str(state / "diffgemma" / "engine.log"),
        "cmd": server_command(socket_path, next_edit_chain_model_dir),
        "timeout_ms": 120_000,
    }
    report, output = await run_driver(nvim, short_tmp, DRIVER, cfg, source.parent, socket_path, 240)
    logs = [state / "nvim" / "lsp.log", state / "diffgemma" / "lsp.log"]
    tails = "".join(path.read_text(errors="replace")[-3000:] for path in logs if path.exists())
    explained = json.dumps(report, indent=2) + "\n" + output[-2000:] + tails
    assert report["ok"], explained
    assert report["buffer"] == STEPS[-1] != RENAMED, explained
    tabs = report["tabs"]
    assert len(tabs) == 3, explained
    for tab, line, followed in zip(tabs, PLACE_LINES, FOLLOWED_LINES, strict=True):
        (edit,) = tab["edits"]
        assert edit["newText"] == followed and edit["range"]["start"] == {"line": line, "character": 0}, explained
        # the place's line, to the next line's start: the last line's too (the line after the final line break; it
        # was the last line's end past its line break, which VS Code reads as before it)
        assert edit["range"]["end"] == {"line": line + 1, "character": 0}, explained
        assert tab["jump"] is True and tab["cursor"] != line, explained  # shown away from the cursor: a jump
        assert tab["hints"] == [{"row": tab["cursor"], "text": f"  Tab: line {line + 1}"}], explained
        assert tab["cursor_after"] == line, explained  # <Tab> took the cursor there
    # One request of three windows before the first was shown, and no other before the third was applied.
    first_requests = tabs[0]["requests"]
    assert len(first_requests) == 1 and "(3 windows in one batch)" in first_requests[0], explained
    assert tabs[1]["requests"] == tabs[2]["requests"] == first_requests, explained
