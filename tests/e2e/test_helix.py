"""A real Helix (25.07), under tmux, through editors/helix/languages.toml: the menu item inserts all its lines,
"Rewrite selection" from the code-action menu (space a) replaces a selection in one undo step, a next edit the
server computed when the editing paused is applied from the same menu, and so are the three places of a rename
chain, one action each, all computed in one batch."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest

from diffgemma_lsp.edit_history import BURST_GAP_S
from tests.e2e.test_lsp_engine import _kill_engine
from tests.support.engine import EngineProcess, RawClient
from tests.support.models import (
    MEMORIZED_MIDDLE,
    MEMORIZED_PREFIX,
    MEMORIZED_SUFFIX,
    SINGLE_LINE_AFTER,
    SINGLE_LINE_MIDDLE,
    SINGLE_LINE_PREFIX,
    SINGLE_LINE_SUFFIX,
)
from tests.support.next_edit_chain import CHAIN, CHAIN_NAME, FOLLOWED_LINES, PLACE_LINES, STEPS
from tests.support.next_edits import AREA, AREA_NAME, FOLLOWED, RENAMED

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parents[2]
HX_ENV = "DIFFGEMMA_HX"


def _helix() -> str:
    hx = os.environ.get(HX_ENV) or shutil.which("hx")
    if not hx:
        pytest.skip(f"Helix not found: set {HX_ENV} or put hx on PATH (or run: make test-editors)")
    if not shutil.which("tmux"):
        pytest.skip("tmux is needed to drive Helix")
    return hx


def _toml_value(value: object) -> str:
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(item) for item in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{key} = {_toml_value(item)}" for key, item in value.items()) + " }"
    return str(value).lower() if isinstance(value, bool) else str(value)


def _languages_toml(command: list[str], settings: dict[str, object]) -> str:
    """The project's languages.toml, its server command pointed at this test's server and engine."""
    project = tomllib.loads((ROOT / "editors" / "helix" / "languages.toml").read_text())
    server = project["language-server"]["diffgemma"]
    assert server["command"] == "diffgemma-lsp" and server["args"] == ["--stdio"]
    python = next(language for language in project["language"] if language["name"] == "python")
    assert "diffgemma" in python["language-servers"]
    return (
        "[language-server.diffgemma]\n"
        f"command = {_toml_value(command[0])}\n"
        f"args = {_toml_value(command[1:])}\n"
        f"config = {_toml_value(settings)}\n\n"
        '[[language]]\nname = "python"\nlanguage-servers = ["diffgemma"]\n'  # no pylsp on this machine
    )


TMUX_SERVER = f"dg-test-{os.getpid()}"
"""This test process's own tmux server (``-L``): on the default one, an existing server would start Helix in its
environment, without this session's mark (so what it left behind went unseen), and the session-end check would
take a server others use for this session's."""


def _tmux(*args: str) -> str:
    return subprocess.run(["tmux", "-L", TMUX_SERVER, *args], capture_output=True, text=True, timeout=10).stdout


def _wait_for(session: str, text: str, timeout: float, keys: tuple[str, ...] = ()) -> str:
    deadline = time.monotonic() + timeout
    while True:
        screen = _tmux("capture-pane", "-p", "-t", session)
        if text in screen:
            return screen
        if time.monotonic() > deadline:
            raise AssertionError(f"{text!r} never appeared on screen:\n{screen}")
        for key in keys:
            _tmux("send-keys", "-t", session, key)
            if key == "Escape":
                time.sleep(0.3)  # apart, or the terminal reads Escape and the next key as Alt-<key>
        time.sleep(0.5)


def _start_helix(
    hx: str,
    tmp: Path,
    socket_path: Path,
    text: str,
    settings: dict[str, object] | None = None,
    name: str = "example.py",
) -> tuple[str, Path]:
    """The project's languages.toml pointed at this test's server (``settings`` added to its config); Helix in a
    tmux session on the file ``name`` holding ``text``. Returns the session's name and the file."""
    config = tmp / "xdg_config_home" / "helix"
    config.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "diffgemma_lsp", "--stdio", "--engine-socket", str(socket_path)]
    options = {"debounceMs": 0, "extraContextTokens": 0, **(settings or {})}
    (config / "languages.toml").write_text(_languages_toml(command, options))
    source = tmp / name
    source.write_text(text)
    session = f"dg-hx-{os.getpid()}"
    env = {"HOME": str(tmp), "TERM": "xterm-256color"}
    # tmux starts Helix in its server's environment, not this one: pass on the XDG dirs and the import path (the
    # server under test is the one this test imports).
    passed = {k: v for k, v in os.environ.items() if k.startswith("XDG_") or k in ("PYTHONPATH", "OMP_NUM_THREADS")}
    env_args = [f"{key}={value}" for key, value in {**env, **passed}.items()]
    _tmux("new-session", "-d", "-s", session, "-x", "120", "-y", "30", "env", *env_args, hx, str(source))
    return session, source


def _saved_then_undone(session: str, source: Path, edited: str, before: str) -> None:
    """`:w` saves ``edited``; one `u` and `:w` save ``before`` (the edit was one undo step); then quit."""
    assert _write_and_wait(session, source, edited) == edited
    _tmux("send-keys", "-t", session, "u")
    time.sleep(0.3)
    assert _write_and_wait(session, source, before) == before, "one undo did not take the edit back"
    _tmux("send-keys", "-t", session, ":q!", "Enter")


def _write_and_wait(session: str, source: Path, text: str, timeout: float = 10) -> str:
    """`:w`, then the file once it holds ``text`` (or what it holds after ``timeout``)."""
    _tmux("send-keys", "-t", session, "Escape")
    time.sleep(0.3)  # apart, or the terminal reads Escape and ":" as Alt-:
    _tmux("send-keys", "-t", session, ":w", "Enter")
    deadline = time.monotonic() + timeout
    while _read(source) != text and time.monotonic() < deadline:
        time.sleep(0.2)
    return source.read_text()


def _read(source: Path) -> str | None:
    """The file's text; None while it is not there (Helix saves by writing a new file and renaming it over the old:
    between the two the name is missing)."""
    try:
        return source.read_text()
    except FileNotFoundError:
        return None


def test_menu_item_inserts_the_whole_multi_line_completion(isolated_env: Path, memorized_model_dir: Path) -> None:
    hx = _helix()
    socket_path = isolated_env / "run" / "engine.sock"
    engine = EngineProcess(memorized_model_dir, socket_path, isolated_env / "engine.log")
    session, source = _start_helix(hx, isolated_env, socket_path, MEMORIZED_PREFIX + MEMORIZED_SUFFIX)
    try:
        _wait_for(session, "def add(a, b):", 30)
        _tmux("send-keys", "-t", session, "j", "i")
        # Ask until the engine answers (the language server connects in the background).
        screen = _wait_for(session, "total = a + b", 60, keys=("C-x",))
        assert "diffgemma" in screen or "total = a + b" in screen
        _tmux("send-keys", "-t", session, "Tab")
        _wait_for(session, "return total", 10)
        _tmux("send-keys", "-t", session, "Enter")
        time.sleep(0.5)
        _tmux("send-keys", "-t", session, "Escape")
        time.sleep(0.3)  # apart, or the terminal reads Escape and ":" as Alt-:
        _tmux("send-keys", "-t", session, ":w", "Enter")
        time.sleep(0.5)
        deadline = time.monotonic() + 10
        while MEMORIZED_MIDDLE not in source.read_text() and time.monotonic() < deadline:
            time.sleep(0.2)
        _tmux("send-keys", "-t", session, ":q!", "Enter")
        written = source.read_text()
        assert written.startswith(MEMORIZED_PREFIX + MEMORIZED_MIDDLE), written
        assert written.endswith(MEMORIZED_SUFFIX.lstrip("\n")), written
    finally:
        _tmux("kill-session", "-t", session)
        engine.stop()
        _kill_engine(socket_path, signal.SIGTERM)


def test_menu_item_inserts_a_single_line_completion_whole(isolated_env: Path, single_line_model_dir: Path) -> None:
    """A one-line completion that starts with a space and ends before the ")" on the line: the menu's item (Tab
    selects it, Enter accepts) puts all of it there, and the rest of the line stays after it."""
    hx = _helix()
    socket_path = isolated_env / "run" / "engine.sock"
    engine = EngineProcess(single_line_model_dir, socket_path, isolated_env / "engine.log")
    # Helix's workspace is its working directory, this repository: no chunks of it in the prompt the model learned.
    settings: dict[str, object] = {"repoContextTokens": 0}
    # Helix's own word completion would open its menu ("add") on the word before the cursor first, and a menu that
    # is open takes no later answer: the server's item would never show.
    (isolated_env / "xdg_config_home" / "helix").mkdir(parents=True)
    (isolated_env / "xdg_config_home" / "helix" / "config.toml").write_text(
        "[editor.word-completion]\nenable = false\n"
    )
    session, source = _start_helix(hx, isolated_env, socket_path, SINGLE_LINE_PREFIX + SINGLE_LINE_SUFFIX, settings)
    expected = SINGLE_LINE_PREFIX + SINGLE_LINE_MIDDLE + SINGLE_LINE_SUFFIX
    try:
        _wait_for(session, "def add(a, b):", 30)
        _tmux("send-keys", "-t", session, "j", "g", "l", "i")  # line 2's last character, the ")": insert before it
        _wait_for(session, "INS", 10)
        _wait_for(session, "a + b", 60, keys=("C-x",))  # asked until the engine answers
        _tmux("send-keys", "-t", session, "Tab")
        _wait_for(session, SINGLE_LINE_AFTER, 10)
        _tmux("send-keys", "-t", session, "Enter")
        assert _write_and_wait(session, source, expected) == expected
        _tmux("send-keys", "-t", session, ":q!", "Enter")
    finally:
        _tmux("kill-session", "-t", session)
        engine.stop()
        _kill_engine(socket_path, signal.SIGTERM)


WRONG_MIDDLE = MEMORIZED_MIDDLE.replace("a + b", "a - b")
"""The memorized middle with one token changed: the selection a rewrite must turn into MEMORIZED_MIDDLE."""


def test_rewrite_selection_from_the_code_action_menu(isolated_env: Path, memorized_model_dir: Path) -> None:
    """Select the wrong middle (line 2's start to line 3's end), space a, pick "Rewrite selection": the file is
    exactly prefix + memorized middle + suffix; one `u` gives the old text back."""
    hx = _helix()
    socket_path = isolated_env / "run" / "engine.sock"
    engine = EngineProcess(memorized_model_dir, socket_path, isolated_env / "engine.log")
    original = MEMORIZED_PREFIX + WRONG_MIDDLE + MEMORIZED_SUFFIX
    expected = MEMORIZED_PREFIX + MEMORIZED_MIDDLE + MEMORIZED_SUFFIX
    session, source = _start_helix(hx, isolated_env, socket_path, original)
    try:
        _wait_for(session, "def add(a, b):", 30)
        # Line 2's first character, then select to line 3's last one (Helix selections hold the cursor's
        # character): exactly the wrong middle, without the line break that starts the suffix.
        _tmux("send-keys", "-t", session, "j", "g", "h", "v", "j", "g", "l")
        time.sleep(0.3)
        _tmux("send-keys", "-t", session, "Escape")
        menus = []
        deadline = time.monotonic() + 90
        # The language server connects to the engine in the background: ask again until the edit lands.
        while "total = a + b" not in (screen := _tmux("capture-pane", "-p", "-t", session)):
            assert time.monotonic() < deadline, f"the rewrite never landed:\n{screen}\nmenus:\n" + "\n".join(menus)
            time.sleep(0.3)
            _tmux("send-keys", "-t", session, "Space", "a")
            # Until the server has answered Helix's initialize, space a says "No configured language server
            # supports code actions" and opens nothing: ask again (Escape first closes a menu that opened late).
            menus.append(_wait_for(session, "Rewrite selection", 20, keys=("Escape", "Space", "a")))
            _tmux("send-keys", "-t", session, "Enter")
            for _ in range(75):  # up to 15 s for this one
                if "total = a + b" in _tmux("capture-pane", "-p", "-t", session):
                    break
                time.sleep(0.2)
        _saved_then_undone(session, source, expected, original)
    finally:
        _tmux("kill-session", "-t", session)
        engine.stop()
        _kill_engine(socket_path, signal.SIGTERM)


async def _loaded_engine(model_dir: Path, tmp: Path) -> tuple[EngineProcess, Path]:
    """An engine on ``model_dir`` at ``tmp``/run/engine.sock (its log ``tmp``/engine.log), its model loaded (before
    the edit is typed); and its socket."""
    socket_path = tmp / "run" / "engine.sock"
    socket_path.parent.mkdir(mode=0o700, exist_ok=True)
    engine = EngineProcess(model_dir, socket_path, tmp / "engine.log")
    ready = await RawClient.connect(socket_path)
    await ready.close()
    return engine, socket_path


async def test_a_next_edit_computed_on_a_pause_is_applied_from_the_code_action_menu(
    isolated_env: Path, next_edit_model_dir: Path
) -> None:
    """Issue 29 in Helix, which never asks for next edits: with ``nextEditOnPause`` the server computes one when the
    editing pauses and offers it as "Apply suggested edit" (space a); picking it makes the renamed parameter's use
    follow, and one `u` takes it back. The engine is the real one, on the checkpoint trained to make that edit."""
    hx = _helix()
    engine, socket_path = await _loaded_engine(next_edit_model_dir, isolated_env)

    # Helix's workspace is its working directory, this repository: no chunks of it in the prompt the model learned.
    settings: dict[str, object] = {"nextEditOnPause": True, "repoContextTokens": 0}
    # No completion asked while the rename is typed: one in flight or answered at the pause holds the next edit
    # back (one suggestion at a time), and the server cannot see that Helix closed its menu on Escape.
    (isolated_env / "xdg_config_home" / "helix").mkdir(parents=True)
    (isolated_env / "xdg_config_home" / "helix" / "config.toml").write_text("[editor]\nauto-completion = false\n")

    def drive() -> None:
        session, source = _start_helix(hx, isolated_env, socket_path, AREA, settings, AREA_NAME)
        try:
            _wait_for(session, "def area(width, height):", 30)
            time.sleep(2.0)  # the language server starts and takes the document
            # "width": line 1 from its 10th character to the word's end; change it to "size"
            _tmux("send-keys", "-t", session, "g", "g", "9", "l", "e", "c", "size")
            time.sleep(0.3)
            _tmux("send-keys", "-t", session, "Escape")
            _wait_for(session, "def area(size, height):", 10)
            time.sleep(BURST_GAP_S + 0.5)  # the burst of editing ends: the server computes the next edit
            _pick_action(session, "Apply suggested edit")
            _wait_for(session, "return size * height", 10)
            _saved_then_undone(session, source, FOLLOWED, RENAMED)
        finally:
            _tmux("kill-session", "-t", session)

    try:
        await asyncio.to_thread(drive)
    finally:
        engine.stop()


def _pick_action(session: str, title: str, timeout: float = 60) -> None:
    """space a until the code-action menu lists an action whose title holds ``title`` (closing it and asking again
    while it does not: the server has not computed it yet), then that action picked (Down to it, Enter)."""
    deadline = time.monotonic() + timeout
    menus = []
    while True:
        _tmux("send-keys", "-t", session, "Space", "a")
        time.sleep(1.0)
        menu = _tmux("capture-pane", "-p", "-t", session)
        menus.append(menu)
        if title in menu:  # after "Rewrite selection" (Helix's cursor is a selection)
            items = [line for line in menu.splitlines() if "Rewrite selection" in line or "Apply sugg" in line]
            below = next(number for number, line in enumerate(items) if title in line)
            _tmux("send-keys", "-t", session, *["Down"] * below, "Enter")
            time.sleep(1.0)
            return
        assert time.monotonic() < deadline, f"{title!r} was never offered:\n" + "\n".join(menus)
        _tmux("send-keys", "-t", session, "Escape")
        time.sleep(0.5)


async def test_a_rename_chain_is_applied_by_three_code_actions_computed_in_one_batch(
    isolated_env: Path, next_edit_chain_model_dir: Path
) -> None:
    """Issue 45's next edits that jump in Helix (code actions: it has no Tab for them): a function renamed at its
    definition; once the editing pauses the server computes the three places of its uses in one request, and space a
    offers "Apply suggested edit (line N)" for each in turn, wherever the cursor is. Each one picked renames that use;
    the engine's log holds the one request of three windows when each is offered (the 2nd and 3rd computed before
    they were asked for)."""
    hx = _helix()
    engine, socket_path = await _loaded_engine(next_edit_chain_model_dir, isolated_env)
    # nextEditLines 1: the window at the cursor (the definition) holds none of the uses, which are the chain's places.
    settings: dict[str, object] = {"nextEditOnPause": True, "nextEditLines": 1, "repoContextTokens": 0}
    (isolated_env / "xdg_config_home" / "helix").mkdir(parents=True)
    (isolated_env / "xdg_config_home" / "helix" / "config.toml").write_text("[editor]\nauto-completion = false\n")

    def requests() -> list[str]:
        return [line for line in engine.log().splitlines() if "a rewrite at strength" in line]

    def drive() -> list[list[str]]:
        session, source = _start_helix(hx, isolated_env, socket_path, CHAIN, settings, CHAIN_NAME)
        seen = []
        try:
            _wait_for(session, "def total(items):", 30)
            time.sleep(2.0)  # the language server starts and takes the document
            _tmux("send-keys", "-t", session, "g", "g", "4", "l", "e", "c", "summed")  # "total" at line 1's 5th
            time.sleep(0.3)
            _tmux("send-keys", "-t", session, "Escape")
            _wait_for(session, "def summed(items):", 10)
            time.sleep(BURST_GAP_S + 0.5)  # the burst of editing ends: the server computes the chain
            for line, followed in zip(PLACE_LINES, FOLLOWED_LINES, strict=True):
                _pick_action(session, f"Apply suggested edit (line {line + 1})")
                _wait_for(session, followed.strip(), 10)
                seen.append(requests())
            assert _write_and_wait(session, source, STEPS[-1]) == STEPS[-1]
            _tmux("send-keys", "-t", session, ":q!", "Enter")
        finally:
            _tmux("kill-session", "-t", session)
        return seen

    try:
        seen = await asyncio.to_thread(drive)
    finally:
        engine.stop()
    first, second, third = seen
    assert len(first) == 1 and "(3 windows in one batch)" in first[0], engine.log()
    assert second == third == first, engine.log()  # no request since: each later place was computed in it
