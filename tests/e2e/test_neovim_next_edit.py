"""Issue 29 in real Neovim 0.11 (headless, the project's own plugin, the real language server): a next edit is
asked at the cursor, shown as extmarks (the replaced line struck through, the new one as a virtual line), applied
with <Tab> in one undo step, or dismissed with <Esc>: the plugin asks by itself after the rename, and the test asks
again once the first suggestion is dismissed.

The engine is the real one, started by the language server on a checkpoint trained to make the next edit of
``tests/support/next_edits.py`` (``build_next_edit``): the rename is typed in Neovim, and the suggestion Neovim shows
and applies is what the model computed."""

from __future__ import annotations

import asyncio
import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.test_lsp_engine import _kill_engine
from tests.e2e.test_neovim import _nvim011
from tests.support.lsp import server_command
from tests.support.neovim import headless_command, lua_prelude
from tests.support.next_edits import AREA, AREA_NAME, FOLLOWED, RENAMED

pytestmark = pytest.mark.e2e

PRELUDE = (
    lua_prelude()
    + r"""
local ns = vim.api.nvim_create_namespace("diffgemma.next_edit")
local function marks() return vim.api.nvim_buf_get_extmarks(0, ns, 0, -1, { details = true }) end

-- Until the engine the server started has loaded its model (diffgemma.status).
local function when_ready(client, then_)
  local engine = nil
  poll("the engine", 60000, function()
    client:request("workspace/executeCommand", { command = "diffgemma.status", arguments = {} }, function(_, result)
      engine = result and result.engine
    end, 0)
    return engine == "ready"
  end, then_)
end


-- The plugin set up with these settings, the file opened as Python, then(), once the engine is ready.
local function start(settings, then_)
  require("diffgemma").setup({ cmd = cfg.cmd, settings = settings, next_edit = true })
  vim.cmd.edit(vim.fn.fnameescape(cfg.file))
  vim.bo.filetype = "python"
  poll("the client", 20000, function()
    local client = vim.lsp.get_clients({ bufnr = 0, name = "diffgemma" })[1]
    return client and client.initialized and client
  end, function(client) when_ready(client, then_) end)
end
"""
)
"""The drivers' helpers (Lua): ``lua_prelude``'s (the report, ``poll``, ``feed``), the next-edit extmarks,
``when_ready`` and ``start``."""

DRIVER = (
    PRELUDE
    + r"""
local function ask(then_)
  vim.api.nvim_win_set_cursor(0, { 1, 10 })
  local answered = nil
  require("diffgemma").next_edit({ on_done = function(result) answered = { result = result } end })
  poll("the next edit", 30000, function() return answered end, function() then_(answered.result) end)
end

start({ debounceMs = 0, extraContextTokens = 0 }, function()
  vim.api.nvim_buf_set_text(0, 0, 9, 0, 14, { "size" })
  log("renamed: %s", vim.api.nvim_buf_get_lines(0, 0, 1, false)[1])
  -- The plugin asks by itself after the edit, and draws the answer.
  poll("the suggestion after the edit", 30000, function() return #marks() > 0 end, function()
    report.marks = vim.tbl_map(function(mark)
      local details = mark[4]
      return { row = mark[2], hl_group = details.hl_group, virt_lines = details.virt_lines }
    end, marks())
    log("shown: %d extmark(s)", #report.marks)
    feed("<Esc>")
    poll("the dismissal", 5000, function() return #marks() == 0 end, function()
      report.dismissed = text()
      ask(function(again)
        if not again then return finish(false, "no next edit when asked") end
        report.edits = vim.deepcopy(again.edits)  -- before <Tab>: applying them marks them
        feed("<Tab>")
        poll("the edit applied", 5000, function() return text() == cfg.expected end, function()
          report.applied = text()
          report.marks_after = #marks()
          feed("u")
          poll("one undo", 5000, function() return text() == cfg.original end, function() finish(true) end)
        end)
      end)
    end)
  end)
end)
"""
)


async def run_driver(
    nvim: str, short_tmp: Path, driver: str, cfg: dict[str, object], cwd: Path, socket_path: Path, timeout_s: float
) -> tuple[dict[str, Any], str]:
    """Run the Lua ``driver`` in headless Neovim with the plugin and ``cfg`` (its ``report`` path), in ``cwd``, with
    its state under ``short_tmp/state``; stop the engine on ``socket_path`` after. Returns the report and Neovim's
    output."""
    path = short_tmp / "driver.lua"
    path.write_text(driver)
    command = headless_command(nvim, path)
    env = dict(os.environ, DIFFGEMMA_TEST=json.dumps(cfg), XDG_STATE_HOME=str(short_tmp / "state"))
    try:
        process = await asyncio.create_subprocess_exec(
            *command,
            cwd=cwd,
            env=env,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        async with asyncio.timeout(timeout_s):
            output, _ = await process.communicate()
    finally:
        _kill_engine(socket_path, signal.SIGTERM)
    return read_report(Path(str(cfg["report"]))), output.decode(errors="replace")


def prepared(short_tmp: Path, name: str, text: str) -> tuple[Path, Path]:
    """A private socket folder and a file ``name`` holding ``text`` in a folder of its own: (socket, file)."""
    socket_dir = short_tmp / "run"
    socket_dir.mkdir(mode=0o700)
    source = short_tmp / "work" / name
    source.parent.mkdir()
    source.write_text(text)
    return socket_dir / "engine.sock", source


def read_report(path: Path) -> dict[str, Any]:
    """The driver's report, or why there is none."""
    return json.loads(path.read_text()) if path.exists() else {"ok": False, "why": "no report"}


async def test_neovim_shows_a_next_edit_applies_it_with_tab_in_one_undo_and_dismisses_it(
    short_tmp: Path, next_edit_model_dir: Path
) -> None:
    nvim = _nvim011()
    socket_path, source = prepared(short_tmp, AREA_NAME, AREA)
    report_path = short_tmp / "report.json"
    cfg = {
        "file": str(source),
        "report": str(report_path),
        "original": RENAMED,
        "expected": FOLLOWED,
        "cmd": server_command(socket_path, next_edit_model_dir),
        "timeout_ms": 90_000,
    }
    report, output = await run_driver(nvim, short_tmp, DRIVER, cfg, source.parent, socket_path, 180)
    explained = json.dumps(report, indent=2) + "\n" + output[-2000:]
    assert report["ok"], explained
    assert report["edits"] == [
        {
            "range": {"start": {"line": 1, "character": 0}, "end": {"line": 2, "character": 0}},
            "newText": "    return size * height\n",
        }
    ], explained
    struck = [mark for mark in report["marks"] if mark.get("hl_group") == "DiffgemmaNextEditDelete"]
    added = [mark for mark in report["marks"] if mark.get("virt_lines")]
    assert [mark["row"] for mark in struck] == [1], explained  # the line it replaces, struck through
    assert added and added[0]["virt_lines"] == [[["    return size * height", "DiffgemmaNextEditAdd"]]], explained
    assert report["dismissed"] == RENAMED and report["applied"] == FOLLOWED and report["marks_after"] == 0
