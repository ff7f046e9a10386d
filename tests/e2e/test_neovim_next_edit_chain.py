"""Issue 45, next edits that jump, in real Neovim 0.11 (headless, the project's own plugin, the real language server
and engine): a function renamed at its definition, then its three uses renamed with three <Tab>s, each one a jump
to the next place (the hint at the cursor, the cursor taken there) and its edit.

The engine runs a checkpoint trained for this chain (``build_next_edit_chain``): the three places go to it in one
request, denoised in one batch, before the first is shown. That the 2nd and 3rd were computed before they were
asked for is read from the engine's own request log at each <Tab>: it holds the one request of three windows and no
other."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from pathlib import Path

import pytest

from tests.e2e.test_lsp_engine import _kill_engine
from tests.e2e.test_neovim import PLUGIN, _nvim011
from tests.support.lsp import server_command
from tests.support.next_edit_chain import CHAIN, CHAIN_NAME, FOLLOWED_LINES, PLACE_LINES, RENAMED, STEPS

pytestmark = pytest.mark.e2e

DRIVER = r"""
local cfg = vim.json.decode(vim.env.DIFFGEMMA_TEST)
local report = { log = {}, tabs = {} }
local done = false
local function log(fmt, ...) table.insert(report.log, string.format(fmt, ...)) end
local function text() return table.concat(vim.api.nvim_buf_get_lines(0, 0, -1, false), "\n") .. "\n" end
local function finish(ok, why)
  if done then return end
  done = true
  report.ok, report.why, report.buffer = ok, why, text()
  vim.fn.writefile({ vim.json.encode(report) }, cfg.report)
  vim.cmd("qa!")
end
vim.defer_fn(function() finish(false, "timed out") end, cfg.timeout_ms)
local function poll(ms, check, on_done, what)
  local deadline = vim.uv.now() + ms
  local function tick()
    if done then return end
    local ok, value = pcall(check)
    if not ok then return finish(false, tostring(value)) end
    if value then return on_done(value) end
    if vim.uv.now() > deadline then return finish(false, "gave up waiting for " .. what) end
    vim.defer_fn(tick, 50)
  end
  tick()
end
local function feed(keys) log("feed %s", keys); vim.api.nvim_feedkeys(vim.keycode(keys), "m", false) end
local ns = vim.api.nvim_create_namespace("diffgemma.next_edit")
local function marks() return vim.api.nvim_buf_get_extmarks(0, ns, 0, -1, { details = true }) end
-- The engine's request log: its next-edit requests (rewrites) so far, as it wrote them.
local function requests()
  if vim.fn.filereadable(cfg.engine_log) == 0 then return {} end
  return vim.tbl_filter(function(line) return line:find("a rewrite at strength", 1, true) ~= nil end,
    vim.fn.readfile(cfg.engine_log))
end

local function when_ready(client, then_)
  local engine = nil
  poll(60000, function()
    client:request("workspace/executeCommand", { command = "diffgemma.status", arguments = {} }, function(_, result)
      engine = result and result.engine
    end, 0)
    return engine == "ready"
  end, then_, "the engine")
end

-- Each step: the plugin has asked by itself (after the last change) and shows the next place; record it, <Tab>.
local function step(index)
  if index > #cfg.steps then return finish(true) end
  poll(30000, function()
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
    poll(5000, function() return text() == cfg.steps[index] end, function()
      report.tabs[index].cursor_after = vim.api.nvim_win_get_cursor(0)[1] - 1
      step(index + 1)
    end, "edit " .. index .. " applied")
  end, "place " .. index)
end

-- nextEditLines 1: the window at the cursor (the definition) holds none of the uses, which are the chain's places.
local settings = { debounceMs = 0, extraContextTokens = 0, nextEditLines = 1 }
require("diffgemma").setup({ cmd = cfg.cmd, settings = settings, next_edit = true })
vim.cmd.edit(vim.fn.fnameescape(cfg.file))
vim.bo.filetype = "python"
poll(20000, function()
  local client = vim.lsp.get_clients({ bufnr = 0, name = "diffgemma" })[1]
  return client and client.initialized and client
end, function(client) when_ready(client, function()
  vim.api.nvim_win_set_cursor(0, { 1, 4 })
  vim.api.nvim_buf_set_text(0, 0, 4, 0, 9, { "summed" })
  log("renamed: %s", vim.api.nvim_buf_get_lines(0, 0, 1, false)[1])
  step(1)
end) end, "the client")
"""


async def test_neovim_applies_a_rename_chain_of_three_places_with_three_tabs_computed_in_one_batch(
    short_tmp: Path, next_edit_chain_model_dir: Path
) -> None:
    nvim = _nvim011()
    socket_dir = short_tmp / "run"
    socket_dir.mkdir(mode=0o700)
    socket_path = socket_dir / "engine.sock"
    source = short_tmp / "work" / CHAIN_NAME
    source.parent.mkdir()
    source.write_text(CHAIN)
    report_path = short_tmp / "report.json"
    state = short_tmp / "state"
    cfg = {
        "file": str(source),
        "report": str(report_path),
        "steps": STEPS,
        "engine_log": str(state / "diffgemma" / "engine.log"),
        "cmd": server_command(socket_path, next_edit_chain_model_dir),
        "timeout_ms": 120_000,
        "t0": time.monotonic(),
    }
    driver = short_tmp / "driver.lua"
    driver.write_text(DRIVER)
    command = [nvim, "--headless", "-u", "NONE", "-i", "NONE", "-n", "--cmd", f"set rtp+={PLUGIN}"]
    command += ["-c", f"luafile {driver}"]
    env = dict(os.environ, DIFFGEMMA_TEST=json.dumps(cfg), XDG_STATE_HOME=str(state))
    try:
        process = await asyncio.create_subprocess_exec(
            *command,
            cwd=source.parent,
            env=env,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        async with asyncio.timeout(240):
            output, _ = await process.communicate()
    finally:
        _kill_engine(socket_path, signal.SIGTERM)
    report = json.loads(report_path.read_text()) if report_path.exists() else {"ok": False, "why": "no report"}
    logs = [state / "nvim" / "lsp.log", state / "diffgemma" / "lsp.log"]
    tails = "".join(path.read_text(errors="replace")[-3000:] for path in logs if path.exists())
    explained = json.dumps(report, indent=2) + "\n" + output.decode(errors="replace")[-2000:] + tails
    assert report["ok"], explained
    assert report["buffer"] == STEPS[-1] != RENAMED, explained
    tabs = report["tabs"]
    assert len(tabs) == 3, explained
    for tab, line, followed in zip(tabs, PLACE_LINES, FOLLOWED_LINES, strict=True):
        (edit,) = tab["edits"]
        assert edit["newText"] == followed and edit["range"]["start"] == {"line": line, "character": 0}, explained
        # the place's line, to the next line's start (or, for the last line, to its end: Neovim sends no last EOL)
        end = edit["range"]["end"]
        assert end == {"line": line + 1, "character": 0} or (end["line"] == line == PLACE_LINES[-1]), explained
        assert tab["jump"] is True and tab["cursor"] != line, explained  # shown away from the cursor: a jump
        assert tab["hints"] == [{"row": tab["cursor"], "text": f"  Tab: line {line + 1}"}], explained
        assert tab["cursor_after"] == line, explained  # <Tab> took the cursor there
    # One request of three windows before the first was shown, and no other before the third was applied.
    first_requests = tabs[0]["requests"]
    assert len(first_requests) == 1 and "(3 windows in one batch)" in first_requests[0], explained
    assert tabs[1]["requests"] == tabs[2]["requests"] == first_requests, explained
