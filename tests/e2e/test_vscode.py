"""Real VS Code (code-server 4.100.3 = VS Code 1.100.3) in headless Chromium, with the packaged extension
(editors/vscode) and the real server and engine.

Each test packages the extension as a .vsix, installs it into a private extensions dir, starts code-server in
its own process group with private settings, and runs the Playwright driver (editors/vscode/e2e/e2e.mjs). The
driver works the editor the way a user does (open the file at the line after the prefix; then trigger an inline
suggestion, Tab, save; or select the wrong middle, "Rewrite selection" from the code action menu or the
instruction command, save, undo, save; or rename a parameter, wait for the next edit drawn, Tab, save, undo, save)
and writes a JSON report that the test asserts on.

Needs node/npm, Chromium and code-server: ``bash editors/vscode/scripts/setup-e2e.sh`` installs them. Without
them the test skips, unless DIFFGEMMA_REQUIRE_VSCODE=1 makes that a failure.
"""

from __future__ import annotations

import asyncio
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
from tests.support.models import (
    MEMORIZED_MIDDLE,
    MEMORIZED_PREFIX,
    MEMORIZED_SUFFIX,
    SINGLE_LINE_MIDDLE,
    SINGLE_LINE_PREFIX,
    SINGLE_LINE_SUFFIX,
)
from tests.support.next_edits import AREA, AREA_NAME, FOLLOWED, RENAMED
from tests.support.npm import EXTENSION, ROOT, ensure_node_modules, run_npm

pytestmark = pytest.mark.e2e
CODE_SERVER_ENV = "DIFFGEMMA_CODE_SERVER"
"""The code-server package dir, or its entry script (out/node/entry.js, or bin/code-server)."""
CHROMIUM_ENV = "DIFFGEMMA_CHROMIUM"
REQUIRE_ENV = "DIFFGEMMA_REQUIRE_VSCODE"
ARTIFACTS_ENV = "DIFFGEMMA_E2E_ARTIFACTS"
"""A folder to keep the run's report, screenshots and logs in (they are deleted with the temp dir otherwise)."""
DEFAULT_CODE_SERVER = ROOT / ".cache" / "editors" / "code-server-4.100.3"
SETUP = "bash editors/vscode/scripts/setup-e2e.sh"
DRIVER = EXTENSION / "e2e" / "e2e.mjs"
LISTENING = re.compile(r"HTTP server listening on (http://127\.0\.0\.1:\d+)")


def _missing(what: str) -> None:
    if os.environ.get(REQUIRE_ENV) == "1":
        pytest.fail(f"{what}, and {REQUIRE_ENV}=1 requires it (install: {SETUP})")
    pytest.skip(f"{what} (install: {SETUP}; {REQUIRE_ENV}=1 makes this a failure)")


def _code_server(node: str) -> list[str]:
    """The command that runs code-server."""
    location = Path(os.environ.get(CODE_SERVER_ENV) or DEFAULT_CODE_SERVER)
    if location.is_dir():
        location = location / "out" / "node" / "entry.js"
    if not location.is_file():
        _missing(f"code-server is not at {location} (set {CODE_SERVER_ENV})")
    return [node, str(location)] if location.suffix in (".js", ".mjs") else [str(location)]


def _chromium() -> str:
    for candidate in (os.environ.get(CHROMIUM_ENV), "chromium", "chromium-browser", "google-chrome"):
        if candidate and (found := shutil.which(candidate)):
            return found
    _missing(f"Chromium is not on PATH (set {CHROMIUM_ENV})")
    raise AssertionError("unreachable")


@pytest.fixture(scope="session")
def vscode_tools() -> tuple[str, str, list[str], str]:
    """node, npm, code-server's command and chromium; skips (or fails) when one is missing.

    Session-scoped and requested first, so that a skip comes before the test model is built."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        _missing("node/npm are not on PATH")
    assert node is not None and npm is not None
    return node, npm, _code_server(node), _chromium()


def _processes_mentioning(needle: str) -> list[str]:
    """Command lines of live processes that contain ``needle``."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if needle in cmdline and int(pid) != os.getpid():
            found.append(f"{pid}: {cmdline.strip()}")
    return found


def _stop_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM code-server's whole process group (its extension hosts and the LSP servers outlive the browser),
    then SIGKILL what is left."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    if proc.poll() is None:
        proc.kill()
        proc.wait(timeout=10)


def _run_driver(command: list[str], env: dict[str, str]) -> tuple[int | str, str]:
    """Run the Playwright driver; on a timeout, SIGTERM it first (Playwright then closes Chromium, which runs in
    a process group of its own), and SIGKILL its group if that is not enough."""
    driver = subprocess.Popen(
        command,
        cwd=EXTENSION,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )
    try:
        output, _ = driver.communicate(timeout=READY_TIMEOUT_S + 180)
        return driver.returncode, output
    except subprocess.TimeoutExpired:
        driver.terminate()
        try:
            output, _ = driver.communicate(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(driver.pid, signal.SIGKILL)
            output, _ = driver.communicate()
        return "timeout", output


def _wait_for_url(proc: subprocess.Popen[bytes], log: Path, timeout: float = 60) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = log.read_text(errors="replace") if log.exists() else ""
        if match := LISTENING.search(text):
            return match[1]
        if proc.poll() is not None:
            raise AssertionError(f"code-server exited ({proc.returncode}):\n{text[-3000:]}")
        time.sleep(0.1)
    raise AssertionError(f"code-server did not listen within {timeout} s:\n{log.read_text(errors='replace')[-3000:]}")


def _cursor_after(text: str) -> str:
    """VS Code's status bar position (1-based) at the end of ``text``."""
    lines = text.split("\n")
    return f"Ln {len(lines)}, Col {len(lines[-1]) + 1}"


def _tail(path: Path, chars: int = 4000) -> str:
    return path.read_text(errors="replace")[-chars:] if path.exists() else "(none)"


def _run_vscode(
    vscode_tools: tuple[str, str, list[str], str],
    model_dir: Path | None,
    tmp: Path,
    original: str,
    scenario: dict[str, object],
    extra_settings: dict[str, object] | None = None,
    name: str = "example.py",
    keybindings: list[dict[str, str]] | None = None,
) -> tuple[dict, str, Path]:
    """Package and install the extension, start code-server on a workspace whose file ``name`` holds ``original``,
    and run the driver with ``scenario`` added to its configuration (the engine at ``tmp``/run/engine.sock: one the
    server starts on ``model_dir``, or, for None, one already listening there). Returns the report, its JSON (to
    explain a failure) and the file; asserts that no process outlived code-server."""
    node, npm, code_server, chromium = vscode_tools
    ensure_node_modules(npm)
    if not (EXTENSION / "node_modules" / "playwright-core").is_dir():
        _missing("playwright-core is not installed in editors/vscode")
    timings: dict[str, float] = {}
    started = time.monotonic()

    # The .vsix, as a user installs it.
    vsix = tmp / "diffgemma.vsix"
    run_npm(npm, "run", "package", "--", "--out", str(vsix))
    timings["packaged_after_s"] = time.monotonic() - started
    user_data, extensions = tmp / "user-data", tmp / "extensions"
    install = subprocess.run(
        [*code_server, "--user-data-dir", str(user_data), "--extensions-dir", str(extensions)]
        + ["--install-extension", str(vsix), "--force"],
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    assert install.returncode == 0, install.stdout + install.stderr
    assert any(extensions.glob("diffgemma.diffgemma-*")), install.stdout + install.stderr
    timings["installed_after_s"] = time.monotonic() - started

    server = Path(sys.executable).parent / "diffgemma-lsp"
    assert server.is_file(), f"{server} is missing: pip install -e . in this venv"
    socket_path = tmp / "run" / "engine.sock"
    lsp_log = tmp / "lsp.log"
    settings = {
        "diffgemma.serverPath": str(server),
        "diffgemma.serverArgs": ["--engine-socket", str(socket_path)]
        + (["--model", str(model_dir)] if model_dir is not None else [])  # None: the engine already listens there
        + ["--log-file", str(lsp_log)],
        "diffgemma.extraContextTokens": 0,
        # A quiet, predictable workbench.
        "workbench.startupEditor": "none",
        "workbench.tips.enabled": False,
        "workbench.enableExperiments": False,
        "security.workspace.trust.enabled": False,
        "telemetry.telemetryLevel": "off",
        "extensions.autoCheckUpdates": False,
        "extensions.autoUpdate": False,
        "update.mode": "none",
        "files.autoSave": "off",
        "editor.quickSuggestions": {"other": False, "comments": False, "strings": False},
        "editor.suggestOnTriggerCharacters": False,
        "chat.commandCenter.enabled": False,
        **(extra_settings or {}),
    }
    (user_data / "User").mkdir(parents=True, exist_ok=True)
    (user_data / "User" / "settings.json").write_text(json.dumps(settings, indent=2))
    if keybindings:  # the user's own keybindings.json
        (user_data / "User" / "keybindings.json").write_text(json.dumps(keybindings, indent=2))

    workspace = tmp / "ws"
    workspace.mkdir()
    source = workspace / name
    source.write_text(original)

    cs_log = tmp / "code-server.log"
    report_path = tmp / "report.json"
    report: dict = {"ok": False, "why": "the driver wrote no report"}
    with cs_log.open("wb") as cs_out:
        proc = subprocess.Popen(
            [*code_server, "--auth", "none", "--bind-addr", "127.0.0.1:0"]
            + ["--user-data-dir", str(user_data), "--extensions-dir", str(extensions)]
            + ["--disable-telemetry", "--disable-update-check", "--disable-workspace-trust"]
            + ["--disable-getting-started-override", "--ignore-last-opened", str(workspace)],
            cwd=workspace,
            stdout=cs_out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # its own process group: killed whole at the end
        )
    try:
        url = _wait_for_url(proc, cs_log)
        timings["code_server_up_after_s"] = time.monotonic() - started
        cfg = {
            "url": url,
            "workspace": str(workspace),
            "file": str(source),
            "fileName": source.name,
            "line": 2,  # 1-based: the line right after "def add(a, b):"
            "original": original,
            "chromium": chromium,
            "report": str(report_path),
            "shots": str(tmp / "shots"),
            "readyTimeoutMs": READY_TIMEOUT_S * 1000,
            "timeoutMs": (READY_TIMEOUT_S + 150) * 1000,  # the driver's own watchdog, before _run_driver's
            "engineLog": str(tmp / "xdg_state_home" / "diffgemma" / "engine.log"),
            **scenario,
        }
        exit_code, output = _run_driver([node, str(DRIVER)], dict(os.environ, DIFFGEMMA_E2E=json.dumps(cfg)))
        if report_path.exists():
            report = json.loads(report_path.read_text())
        report["driver_exit"] = exit_code
        report["driver_output"] = output[-3000:]
        timings["driver_done_after_s"] = time.monotonic() - started
    finally:
        _stop_group(proc)
        _kill_engine(socket_path, signal.SIGTERM)
    leftovers = _processes_mentioning(str(socket_path))
    for _ in range(50):
        if not leftovers:
            break
        time.sleep(0.1)
        leftovers = _processes_mentioning(str(socket_path))
    report["timings"] = {name: round(value, 1) for name, value in timings.items()}
    report["leftovers"] = leftovers
    report["code_server_log"] = _tail(cs_log)
    report["lsp_log"] = _tail(lsp_log)
    report["engine_log"] = _tail(tmp / "xdg_state_home" / "diffgemma" / "engine.log")
    explain = json.dumps(report, indent=2)
    if artifacts := os.environ.get(ARTIFACTS_ENV):
        keep = Path(artifacts) / str(scenario.get("scenario", "inline"))
        keep.mkdir(parents=True, exist_ok=True)
        (keep / "report.json").write_text(explain)
        if (tmp / "shots").is_dir():
            shutil.copytree(tmp / "shots", keep / "shots", dirs_exist_ok=True)
    print(json.dumps({"timings": report["timings"], "log": report.get("log")}, indent=2))
    assert report["ok"], f"the editor run failed: {report.get('why')}\n{explain}"
    assert not leftovers, f"processes outlived code-server: {leftovers}\n{explain}"
    return report, explain, source


def test_inline_completion_in_vscode_ghost_text_accepted_with_tab(
    vscode_tools: tuple[str, str, list[str], str],
    memorized_model_dir: Path,
    isolated_env: Path,
) -> None:
    """code-server: the extension starts the server; ghost text shows the memorized middle, Tab inserts it all."""
    expected = MEMORIZED_PREFIX + MEMORIZED_MIDDLE + MEMORIZED_SUFFIX
    scenario = {
        "scenario": "inline",
        "middle": MEMORIZED_MIDDLE,
        "acceptedCursor": _cursor_after(MEMORIZED_PREFIX + MEMORIZED_MIDDLE),
    }
    report, explain, source = _run_vscode(
        vscode_tools, memorized_model_dir, isolated_env, MEMORIZED_PREFIX + MEMORIZED_SUFFIX, scenario
    )
    # The ghost text showed both lines of the memorized middle, at the cursor.
    assert report["ghost"] == MEMORIZED_MIDDLE, explain
    # VS Code's Tab: the suggestion starts with a tab's worth of indentation, so the first Tab indents the empty
    # line and the second accepts the rest; the cursor lands at the end of the inserted text.
    assert report["tabPresses"] in (1, 2), explain
    assert _cursor_after(MEMORIZED_PREFIX + MEMORIZED_MIDDLE) in report["cursorAfterAccept"], explain
    # Tab inserted all of it, and nothing else: the saved file is exactly prefix + middle + suffix.
    assert source.read_text().replace("\u00a0", " ") == expected, explain
    assert report["saved"] == expected, explain
    # The status bar item shows the last completion's latency.
    assert re.fullmatch(r"DG \d+ ms", report["statusAfter"]), explain


ACCEPT_NEXT_LINE = {
    "key": "shift+tab",
    "command": "editor.action.inlineSuggest.acceptNextLine",
    "when": "inlineSuggestionVisible && !editorReadonly",
}
"""The binding editors/vscode/README.md gives for acceptNextLine, which VS Code (and Copilot) leave unbound."""


def test_partial_accept_in_vscode_takes_words_and_lines_and_the_rest_stays_shown(
    vscode_tools: tuple[str, str, list[str], str],
    memorized_model_dir: Path,
    isolated_env: Path,
) -> None:
    """code-server: VS Code's own acceptNextWord (Ctrl+Right) and acceptNextLine (bound as the README says) take the
    ghost text piece by piece; after each the rest is still shown, and no new request reached the engine for it."""
    scenario = {
        "scenario": "partial",
        "prefix": MEMORIZED_PREFIX,
        "middle": MEMORIZED_MIDDLE,
        "suffix": MEMORIZED_SUFFIX,
        "presses": ["Control+ArrowRight", "Control+ArrowRight", "Shift+Tab", "Shift+Tab", "Shift+Tab"],
    }
    report, explain, source = _run_vscode(
        vscode_tools,
        memorized_model_dir,
        isolated_env,
        MEMORIZED_PREFIX + MEMORIZED_SUFFIX,
        scenario,
        keybindings=[ACCEPT_NEXT_LINE],
    )
    steps = report["steps"]
    # VS Code's word: the indentation, then the word; its line: to the line break, then the next line.
    assert [step["piece"] for step in steps] == ["    ", "total", " = a + b\n", "    return total"], explain
    assert [step["ghost"] for step in steps[:-1]] == [MEMORIZED_MIDDLE[len(step["taken"]) :] for step in steps[:-1]], (
        explain
    )
    # The rest of the suggestion stayed on screen without a new engine request.
    assert {step["engineRequests"] for step in steps[:-1]} == {report["engineRequestsShown"]}, explain
    assert source.read_text() == MEMORIZED_PREFIX + MEMORIZED_MIDDLE + MEMORIZED_SUFFIX, explain


SINGLE_LINE_SCENARIO = {
    "line": SINGLE_LINE_PREFIX.count("\n") + 1,
    "column": len(SINGLE_LINE_PREFIX.split("\n")[-1]) + 1,  # after "(a", before the ")" on the line
    "expected": SINGLE_LINE_PREFIX + SINGLE_LINE_MIDDLE + SINGLE_LINE_SUFFIX,
}


@pytest.mark.parametrize("accept", ["ghost-text-tab", "menu-enter"])
def test_single_line_completion_in_vscode_inserted_whole(
    accept: str,
    vscode_tools: tuple[str, str, list[str], str],
    single_line_model_dir: Path,
    isolated_env: Path,
) -> None:
    """A one-line completion that starts with a space and ends before the ")" on the line, accepted as a user does:
    the ghost text with Tab, or the suggest widget's item (Ctrl+Space) with Enter. The file is exactly the whole of
    it in place."""
    expected = SINGLE_LINE_PREFIX + SINGLE_LINE_MIDDLE + SINGLE_LINE_SUFFIX
    if accept == "ghost-text-tab":
        scenario = {
            "scenario": "inline",
            "middle": SINGLE_LINE_MIDDLE,
            "acceptedCursor": _cursor_after(SINGLE_LINE_PREFIX + SINGLE_LINE_MIDDLE),
        }
    else:
        scenario = {"scenario": "menu", "label": "a" + SINGLE_LINE_MIDDLE}
    report, explain, source = _run_vscode(
        vscode_tools,
        single_line_model_dir,
        isolated_env,
        SINGLE_LINE_PREFIX + SINGLE_LINE_SUFFIX,
        {**SINGLE_LINE_SCENARIO, **scenario},
    )
    if accept == "ghost-text-tab":
        assert report["ghost"] == SINGLE_LINE_MIDDLE, explain
    else:
        assert report["accepted"] == expected, explain
    assert report["saved"] == expected and source.read_text() == expected, explain


WRONG_MIDDLE = MEMORIZED_MIDDLE.replace("a + b", "a - b")
"""The memorized middle with one token changed: the selection a rewrite must turn into MEMORIZED_MIDDLE."""


def _rewrite_scenario(scenario: str, **extra: object) -> dict[str, object]:
    return {
        "scenario": scenario,
        "selectDown": WRONG_MIDDLE.count("\n"),  # from the start of line 2 to the end of the wrong middle
        "selectedCursor": f"{_cursor_after(MEMORIZED_PREFIX + WRONG_MIDDLE)} ({len(WRONG_MIDDLE)} selected)",
        "expected": MEMORIZED_PREFIX + MEMORIZED_MIDDLE + MEMORIZED_SUFFIX,
        **extra,
    }


def _assert_rewritten_then_undone(report: dict, explain: str, source: Path) -> None:
    original = MEMORIZED_PREFIX + WRONG_MIDDLE + MEMORIZED_SUFFIX
    expected = MEMORIZED_PREFIX + MEMORIZED_MIDDLE + MEMORIZED_SUFFIX
    assert report["before"] == original, explain
    # The selection became exactly the memorized middle (the editor showed it, and saved it) ...
    assert report["rewritten"] == expected, explain
    assert report["savedAfterRewrite"] == expected, explain
    # ... and one Ctrl+Z gave the old text back.
    assert report["undone"] == original, explain
    assert report["savedAfterUndo"] == original, explain
    assert source.read_text() == original, explain


def test_rewrite_selection_code_action_in_vscode(
    vscode_tools: tuple[str, str, list[str], str],
    memorized_model_dir: Path,
    isolated_env: Path,
) -> None:
    """code-server: on a selection, "Refactor..." lists the server's "Rewrite selection"; picking it replaces the
    selection with the model's answer in one undo step."""
    original = MEMORIZED_PREFIX + WRONG_MIDDLE + MEMORIZED_SUFFIX
    report, explain, source = _run_vscode(
        vscode_tools, memorized_model_dir, isolated_env, original, _rewrite_scenario("rewrite-action")
    )
    assert any(action.startswith("Rewrite selection") for action in report["actions"]), explain
    _assert_rewritten_then_undone(report, explain, source)


def test_rewrite_selection_with_instruction_command_in_vscode(
    vscode_tools: tuple[str, str, list[str], str],
    memorized_model_dir: Path,
    isolated_env: Path,
) -> None:
    """code-server: "DiffusionGemma: Rewrite selection with instruction..." asks in an input box (the instruction is
    typed there), then the server rewrites the selection (the FIM test checkpoint ignores the instruction)."""
    original = MEMORIZED_PREFIX + WRONG_MIDDLE + MEMORIZED_SUFFIX
    scenario = _rewrite_scenario("rewrite-instruction", instruction="use a plus sign")
    report, explain, source = _run_vscode(vscode_tools, memorized_model_dir, isolated_env, original, scenario)
    assert report["typed"] == "use a plus sign", explain
    _assert_rewritten_then_undone(report, explain, source)


async def test_next_edit_in_vscode_drawn_then_applied_with_tab_in_one_undo_step(
    vscode_tools: tuple[str, str, list[str], str], isolated_env: Path, next_edit_model_dir: Path
) -> None:
    """code-server, issue 29: the user renames a parameter; once typing pauses the extension asks for the next edit
    and draws it (the use below struck through, its new text as ghost text after it); Tab applies it, and one
    Ctrl+Z takes it back. The engine is the real one, started by the server on the checkpoint trained to make that
    edit. Inline suggestions are off: one shown while the rename is typed would hold the next edit back."""
    scenario = {
        "scenario": "next-edit",
        "renameAt": "1:10",  # the start of "width" in "def area(width, height):"
        "newName": "size",
        "renamed": RENAMED,
        "expected": FOLLOWED,
    }
    settings = {"diffgemma.debounceMs": 0, "editor.inlineSuggest.enabled": False}
    report, explain, source = await asyncio.to_thread(
        _run_vscode, vscode_tools, next_edit_model_dir, isolated_env, AREA, scenario, settings, AREA_NAME
    )
    assert report["drawing"]["struck"] == ["    return width * height"], explain  # the use below, struck through
    assert [text.strip() for text in report["drawing"]["after"]] == ["return size * height"], explain
    assert report["applied"] == FOLLOWED and report["savedAfterApply"] == FOLLOWED, explain
    assert report["drawingAfter"] == {"struck": [], "after": []}, explain  # nothing left drawn
    assert report["undone"] == RENAMED and report["savedAfterUndo"] == RENAMED, explain
    assert source.read_text() == RENAMED, explain
