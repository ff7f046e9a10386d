"""The Neovim README's configurations, copied as written, start the server without a warning (issue 46, item 2).

Each ``lua`` block of editors/neovim/README.md that configures the server becomes a user's ``init.lua`` as it
stands (the plugin's path in step 2 is the only text replaced: it is this checkout). Neovim 0.11 (and 0.12 where
``DIFFGEMMA_NVIM012`` names one) opens a Python file with that ``init.lua`` (filetype detection on, as for a user),
``diffgemma-lsp`` on ``PATH`` as the README says, and the real server and engine on the shipped model. Once the engine
is ready, no message of warning or error level may have reached the editor (``window/showMessage``,
``window/logMessage``, ``vim.notify``). Before: ``settings = {}`` went as a JSON array, and the server answered
"diffgemma: settings must be an object, got list" on every start.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from diffgemma_engine.shared.socket_paths import default_socket_path
from tests.e2e.test_lsp_engine import _kill_engine
from tests.e2e.test_neovim import NVIMS, ROOT
from tests.support.lsp import READY_TIMEOUT_S
from tests.support.neovim import PLUGIN

pytestmark = pytest.mark.e2e
README = PLUGIN / "README.md"

WATCH = r"""
-- Before init.lua: record what reaches the user (the server's messages, notifications).
local report = { messages = {}, notified = {} }
_G.diffgemma_readme_report = report
local notify = vim.notify
vim.notify = function(message, level, opts)
  table.insert(report.notified, { message = tostring(message), level = level or vim.log.levels.INFO })
  return notify(message, level, opts)
end
for _, method in ipairs({ "window/showMessage", "window/logMessage" }) do
  local handler = vim.lsp.handlers[method]
  vim.lsp.handlers[method] = function(err, params, ctx, config)
    table.insert(report.messages, { method = method, type = params.type, message = params.message })
    return handler(err, params, ctx, config)
  end
end
"""

DRIVER = r"""
-- After init.lua and the file: wait for the engine, then write what was recorded.
local report = _G.diffgemma_readme_report
local path = vim.env.DIFFGEMMA_README_REPORT
local function finish(why)
  report.why = why
  report.messages_cmd = vim.api.nvim_exec2("messages", { output = true }).output
  vim.fn.writefile({ vim.json.encode(report) }, path)
  vim.cmd("qa!")
end
vim.defer_fn(function() finish("timed out") end, tonumber(vim.env.DIFFGEMMA_README_TIMEOUT_MS))
local function wait()
  local client = vim.lsp.get_clients({ bufnr = 0, name = "diffgemma" })[1]
  if not (client and client.initialized) then return vim.defer_fn(wait, 100) end
  report.filetype = vim.bo.filetype
  report.init_options = client.config.init_options
  client:request("workspace/executeCommand", { command = "diffgemma.status", arguments = {} }, function(err, result)
    if err then return finish("diffgemma.status: " .. vim.inspect(err)) end
    if not (result and result.engine == "ready") then return vim.defer_fn(wait, 250) end
    report.ready = true
    vim.defer_fn(function() finish(nil) end, 500) -- a message sent with the answer arrives before this
  end, 0)
end
wait()
"""


def _lua_blocks(text: str) -> list[str]:
    """The README's ```lua blocks, unindented."""
    blocks = []
    for match in re.finditer(r"^( *)```lua\n(.*?)^\1```", text, flags=re.MULTILINE | re.DOTALL):
        indent = len(match[1])
        blocks.append("".join(line[indent:] for line in match[2].splitlines(keepends=True)))
    return blocks


def _configs() -> dict[str, str]:
    """The README's two configurations as init.lua files: step 2's runtimepath line (with this checkout's path)
    then step 3's ``setup()`` call; and the nvim-lspconfig style, on its own (no plugin on the runtimepath)."""
    blocks = _lua_blocks(README.read_text())
    runtimepath = next(block for block in blocks if "vim.opt.rtp:append" in block)
    setup = next(block for block in blocks if 'require("diffgemma").setup(' in block)
    lspconfig = next(block for block in blocks if 'vim.lsp.config("diffgemma"' in block)
    assert "/path/to/diffgemma-lsp" in runtimepath, runtimepath
    return {"setup": runtimepath.replace("/path/to/diffgemma-lsp", str(ROOT)) + setup, "lspconfig": lspconfig}


@pytest.mark.parametrize("config", ["setup", "lspconfig"])
@pytest.mark.parametrize("version", sorted(NVIMS))
def test_readme_config_starts_without_a_warning(version: str, config: str, isolated_env: Path) -> None:
    nvim = NVIMS[version]()
    init = isolated_env / "init.lua"
    init.write_text(_configs()[config])
    watch, driver, report_path = isolated_env / "watch.lua", isolated_env / "driver.lua", isolated_env / "report.json"
    watch.write_text(WATCH)
    driver.write_text(DRIVER)
    work = isolated_env / "work"
    work.mkdir()
    (work / ".git").mkdir()  # a project root, as the README's root_markers expect
    (work / "example.py").write_text("def add(a, b):\n    return a + b\n")
    env = dict(
        os.environ,
        PATH=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]),  # diffgemma-lsp
        DIFFGEMMA_README_REPORT=str(report_path),
        DIFFGEMMA_README_TIMEOUT_MS=str((READY_TIMEOUT_S + 30) * 1000),
    )
    command = [nvim, "--headless", "-i", "NONE", "-n", "--cmd", f"luafile {watch}", "-u", str(init)]
    socket_path = default_socket_path()  # the isolated XDG_RUNTIME_DIR's: the config names no socket
    try:
        proc = subprocess.run(
            [*command, "-c", f"luafile {driver}", "example.py"],
            cwd=work,
            env=env,
            capture_output=True,
            text=True,
            timeout=READY_TIMEOUT_S + 60,
            stdin=subprocess.DEVNULL,
        )
    finally:
        _kill_engine(socket_path, signal.SIGTERM)
    assert report_path.exists(), proc.stdout + proc.stderr
    report = json.loads(report_path.read_text())
    explain = json.dumps({**report, "init.lua": init.read_text(), "output": proc.stdout + proc.stderr}, indent=2)
    assert report.get("ready") and report.get("why") is None, explain
    assert report["filetype"] == "python", explain
    warnings = [message for message in report["messages"] if message["type"] <= 2]  # Error 1, Warning 2
    assert warnings == [], explain
    assert [note for note in report["notified"] if note["level"] >= 3] == [], explain  # vim.log.levels.WARN
    assert "diffgemma" not in report["messages_cmd"], explain
