"""Headless Neovim as the editor tests start it: no user config, no shada, no swap files, the project's plugin
(editors/neovim) on the runtimepath."""

from __future__ import annotations

from pathlib import Path

PLUGIN = Path(__file__).resolve().parents[2] / "editors" / "neovim"


def headless_command(nvim: str, script: Path) -> list[str]:
    """``nvim`` headless with the plugin on its runtimepath, running the Lua file ``script``."""
    return [
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
        f"luafile {script}",
    ]


_PRELUDE = r"""
local cfg = vim.json.decode(vim.env.DIFFGEMMA_TEST)
local report = { nvim = tostring(vim.version()), log = {} }
local phase = "setup"
local done = false
local t0 = vim.uv.hrtime()

-- A line of the report's log, after the seconds since the driver started.
local function log(fmt, ...)
  table.insert(report.log, string.format("%7.3f s  ", (vim.uv.hrtime() - t0) / 1e9) .. string.format(fmt, ...))
end

local function text() return table.concat(vim.api.nvim_buf_get_lines(0, 0, -1, false), "\n") .. "\n" end

-- Write the report (ok, why, the phase it ended in, the buffer's text, the mode) to cfg.report and quit Neovim;
-- only the first call counts.
local function finish(ok, why)
  if done then return end
  done = true
  if not ok then log("FAIL (%s): %s", phase, why) end
  report.ok, report.why, report.phase = ok, why, phase
  report.buffer, report.mode = text(), vim.api.nvim_get_mode().mode
  vim.fn.writefile({ vim.json.encode(report) }, cfg.report)
  vim.cmd("qa!")
end

vim.defer_fn(function() finish(false, "timed out") end, cfg.timeout_ms)

-- The phase is what: call check() every poll_ms until it returns a true value, then on_done(value); fail after ms.
local function poll(what, ms, check, on_done)
  phase = what
  local deadline = vim.uv.now() + ms
  local function tick()
    if done then return end
    local ok, value = pcall(check)
    if not ok then return finish(false, tostring(value)) end
    if value then return on_done(value) end
    if vim.uv.now() > deadline then return finish(false, "gave up waiting " .. ms .. " ms for " .. what) end
    vim.defer_fn(tick, poll_ms)
  end
  tick()
end

-- Keys as a user types them ("m": mappings apply).
local function feed(keys)
  log("feed %s", keys)
  vim.api.nvim_feedkeys(vim.keycode(keys), "m", false)
end
"""


def lua_prelude(poll_ms: int = 50) -> str:
    """The start of every editor test's Lua driver (``headless_command`` runs it), which reads its configuration
    from ``vim.env.DIFFGEMMA_TEST`` (JSON: ``report``, the path of the report it writes, and ``timeout_ms``). It
    defines ``cfg``, ``report`` (``nvim``: the version, ``log``), ``phase`` (what the driver waits for), ``done``,
    ``t0`` (when the driver started, ``vim.uv.hrtime()``), and the functions ``log(fmt, ...)``, ``text()`` (the
    buffer's text), ``finish(ok, why)`` (writes the report with ``ok``, ``why``, ``phase``, ``buffer`` and
    ``mode``, and quits), ``poll(what, ms, check, on_done)`` (``check`` every ``poll_ms``) and ``feed(keys)``;
    the driver fails with "timed out" after ``timeout_ms``."""
    return f"local poll_ms = {poll_ms}\n" + _PRELUDE
