"""Partial accept in real Neovim (issue 45): the plugin's keys take the ghost text's next word and next line, and the
rest stays shown, answered by the server from the suggestion it showed, with no new engine request.

Two ghost texts: the plugin's own (``setup({ ghost_text = true })``, editors/neovim/lua/diffgemma/ghost.lua), the
only one on Neovim 0.11 and the one that dims what the model is unsure of, and Neovim 0.12's own
(``vim.lsp.inline_completion``), taken in part through its ``get({ on_accept })``. The 0.12 cases run where
``DIFFGEMMA_NVIM012`` names a 0.12 binary (``make test-editors``). The real server and engine on the memorized
checkpoint; the keys are the plugin's defaults, fed as typed keys (mappings apply).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.e2e.test_neovim import NVIMS, _explain, _run_nvim
from tests.support.models import MEMORIZED_MIDDLE, MEMORIZED_PREFIX, MEMORIZED_SUFFIX
from tests.support.neovim import headless_command, lua_prelude

pytestmark = pytest.mark.e2e

DRIVER = (
    lua_prelude(poll_ms=30)
    + r"""
report.steps = {}

local ns_name = cfg.ghost_text and "diffgemma.ghost" or "nvim.lsp.inline_completion"
local ns = vim.api.nvim_create_namespace(ns_name)
-- The ghost text on screen: its lines, each a list of {text, highlight group} chunks (nil: none shown).
local function ghost()
  local marks = vim.api.nvim_buf_get_extmarks(0, ns, 0, -1, { details = true })
  if #marks == 0 then return nil end
  local lines = { marks[1][4].virt_text or {} }
  vim.list_extend(lines, marks[1][4].virt_lines or {})
  return lines
end
local function ghost_text()
  local lines = ghost()
  if not lines then return "" end
  return table.concat(vim.tbl_map(function(line)
    return table.concat(vim.tbl_map(function(chunk) return chunk[1] end, line))
  end, lines), "\n")
end
-- The engine's requests so far, from its log: one line each.
local function engine_requests()
  local path = vim.env.XDG_STATE_HOME .. "/diffgemma/engine.log"
  local count = 0
  for _, line in ipairs(vim.fn.filereadable(path) == 1 and vim.fn.readfile(path) or {}) do
    if line:find("request %S+.-, %d+ steps") then count = count + 1 end
  end
  return count
end
local function pending(client)
  for _, request in pairs(client.requests) do
    if request.type == "pending" then return true end
  end
  return false
end
local function status(client, on_done)
  client:request("workspace/executeCommand", { command = "diffgemma.status", arguments = {} }, function(_, result)
    on_done(result)
  end, 0)
end

-- Each of cfg.presses: the buffer holds cfg.after[i], the ghost text shows cfg.rest[i] once no request is in flight.
local function press(client, i)
  if i > #cfg.presses then
    return status(client, function(result)
      report.status = { reuseHits = result.reuseHits, reuseLookups = result.reuseLookups }
      finish(true)
    end)
  end
  feed(cfg.presses[i])
  local since = vim.uv.now()
  poll("the piece and the rest after " .. cfg.presses[i], 10000, function()
    return vim.uv.now() - since > 300 and not pending(client) and text() == cfg.after[i]
      and (cfg.rest[i] == vim.NIL or ghost_text() == cfg.rest[i]) -- null: all taken, a new suggestion may show
  end, function()
    local row, col = unpack(vim.api.nvim_win_get_cursor(0))
    table.insert(report.steps, {
      key = cfg.presses[i], ghost = ghost_text(), engine_requests = engine_requests(), cursor = { row, col },
      mode = vim.api.nvim_get_mode().mode,
    })
    log("%s took its piece; %d engine request(s) so far", cfg.presses[i], engine_requests())
    press(client, i + 1)
  end)
end

local function start(client)
  vim.api.nvim_win_set_cursor(0, { 2, 0 })
  vim.api.nvim_feedkeys("i", "n", false)
  poll("the ghost text", 30000, function() return not pending(client) and ghost_text() == cfg.middle end, function()
    report.first = ghost()
    report.engine_requests_shown = engine_requests()
    log("ghost text shown after %d engine request(s)", report.engine_requests_shown)
    press(client, 1)
  end)
end

-- Until the engine answers a completion at the cursor (the model loaded), then start.
local function wait_until_ready(client)
  local params = {
    textDocument = { uri = vim.uri_from_bufnr(0) },
    position = { line = 1, character = 0 },
    context = { triggerKind = 1 },
  }
  local function ask()
    client:request("textDocument/completion", params, function(_, result)
      if done then return end
      local items = result and (result.items or result) or {}
      if #items == 0 then return vim.defer_fn(ask, 250) end
      log("engine ready")
      start(client)
    end, 0)
  end
  ask()
end

require("diffgemma").setup({
  cmd = cfg.cmd, settings = cfg.settings, ghost_text = cfg.ghost_text, next_edit = false,
  unsure_below = cfg.unsure_below,
})
vim.cmd.edit(vim.fn.fnameescape(cfg.file))
vim.bo.filetype = "python"
poll("client initialized", 20000, function()
  local client = vim.lsp.get_clients({ bufnr = 0, name = "diffgemma" })[1]
  return client and client.initialized and client
end, wait_until_ready)
"""
)

PIECES = ["    total", " = a + b", "\n    return total"]
"""The memorized middle as the keys take it: the next word (its indentation and ``total``), the rest of that line,
then the line break and the next line."""
assert "".join(PIECES) == MEMORIZED_MIDDLE
KEYS = ["<M-Right>", "<M-C-Right>", "<M-C-Right>"]
"""The plugin's default keys (copilot.vim's): accept the next word, then the next line twice."""
SETTINGS = {"debounceMs": 0, "extraContextTokens": 0, "editHistoryTokens": 0}
UNSURE_BELOW = 1.01
"""Above any confidence: every character the server sent a confidence for shows in DiffgemmaGhostUnsure (the
memorized checkpoint is sure of all of its answer), so the groups show that the confidence reached the editor."""


@pytest.mark.parametrize(
    ("version", "ghost_text"), [("0.11", True), ("0.12", False), ("0.12", True)], ids=["0.11", "0.12", "0.12-plugin"]
)
def test_the_next_word_and_the_next_lines_are_taken_and_the_rest_stays_shown(
    version: str, ghost_text: bool, isolated_env: Path, memorized_model_dir: Path
) -> None:
    """``ghost_text``: the plugin's own ghost text (0.11 has no other); else Neovim 0.12's."""
    nvim = NVIMS[version]()
    taken = ["".join(PIECES[: i + 1]) for i in range(len(PIECES))]
    report = _run_nvim(
        nvim,
        "partial",
        isolated_env,
        memorized_model_dir,
        driver_code=DRIVER,
        settings=SETTINGS,
        middle=MEMORIZED_MIDDLE,
        presses=KEYS,
        after=[MEMORIZED_PREFIX + part + MEMORIZED_SUFFIX for part in taken],
        rest=[MEMORIZED_MIDDLE[len(part) :] for part in taken[:-1]] + [None],
        unsure_below=UNSURE_BELOW,
        ghost_text=ghost_text,
    )
    assert report["ok"], f"{report.get('why')}\n{_explain(report)}"
    steps = report["steps"]
    # Each key took only its piece, the cursor after it, still typing; the rest stayed shown.
    assert [step["cursor"] for step in steps] == [[2, 9], [2, 17], [3, 16]], _explain(report)
    assert [step["mode"] for step in steps] == ["i", "i", "i"], _explain(report)
    # The rest after the word and after the first line came from the suggestion shown: no new engine request.
    before = report["engine_requests_shown"]
    assert [step["engine_requests"] for step in steps[:2]] == [before, before], _explain(report)
    assert report["status"]["reuseHits"] >= 2, _explain(report)
    if ghost_text:  # the plugin's: the characters' confidence came with the item, and draws them unsure
        groups = {chunk[1] for line in report["first"] for chunk in line}
        assert groups == {"DiffgemmaGhostUnsure"}, _explain(report)


PIECES_CHECK = r"""
local ghost = require("diffgemma.ghost")
ghost.unsure_below = 0.5
local out = {
  words = vim.tbl_map(ghost.next_word, { "    total = 1", "\n    return x", "(a, b)", ".append(x)", "", "  " }),
  lines = vim.tbl_map(ghost.next_line, { "a + b\n    return x", "\n    return x\nmore", "last", "" }),
  -- "é" is one character of the runs (two bytes); the line break has one too
  chunks = ghost.chunks("xé = 1\nyz", { { 2, 0.9 }, { 3, 0.2 }, { 2, 0.9 }, { 1, 0.9 }, { 1, 0.3 } }),
  unknown = ghost.chunks("a\n\nb", nil),
}
vim.fn.writefile({ vim.json.encode(out) }, vim.env.DIFFGEMMA_PIECES_REPORT)
vim.cmd("qa!")
"""


@pytest.mark.parametrize("version", sorted(NVIMS))
def test_the_pieces_a_key_takes_and_the_groups_of_the_ghost_text(version: str, tmp_path: Path) -> None:
    """The plugin's rule for the next word and the next line, and the ghost text's chunks: characters under
    ``unsure_below`` in DiffgemmaGhostUnsure, counted in characters (not bytes), one chunk per run of a group."""
    nvim = NVIMS[version]()
    script, report = tmp_path / "pieces.lua", tmp_path / "pieces.json"
    script.write_text(PIECES_CHECK)
    env = dict(os.environ, DIFFGEMMA_PIECES_REPORT=str(report), XDG_STATE_HOME=str(tmp_path / "state"))
    proc = subprocess.run(headless_command(nvim, script), env=env, capture_output=True, text=True, timeout=60)
    assert report.exists(), proc.stdout + proc.stderr
    sure, unsure = "DiffgemmaGhost", "DiffgemmaGhostUnsure"
    assert json.loads(report.read_text()) == {
        "words": ["    total", "\n    return", "(", ".", "", "  "],
        "lines": ["a + b", "\n    return x", "last", ""],
        "chunks": [[["xé", sure], [" = ", unsure], ["1", sure]], [["y", sure], ["z", unsure]]],
        "unknown": [[["a", sure]], [["", sure]], [["b", sure]]],
    }
