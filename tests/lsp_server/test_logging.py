"""Where the real language server's logs go: its log file and the client's log window, each record at its own
level; stderr, which editors show as errors (Neovim's ``:LspLog`` marks each of its lines ``[ERROR]``), only for
errors."""

from __future__ import annotations

import asyncio
import os
import stat
from pathlib import Path

from lsprotocol import types

from tests.support.lsp import RawLsp, server_command
from tests.support.xdg import xdg_environment


async def _messages(lsp: RawLsp, wanted: int, timeout: float = 60) -> list[dict[str, object]]:
    """The ``window/logMessage`` params once ``wanted`` of them arrived."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        found = [note["params"] for note in lsp.notifications if note["method"] == "window/logMessage"]
        if len(found) >= wanted or loop.time() > deadline:
            return found
        await asyncio.sleep(0.1)


async def test_info_and_warnings_go_to_the_log_window_and_file_and_only_errors_to_stderr(short_tmp: Path) -> None:
    env = dict(os.environ, **xdg_environment(short_tmp))
    workspace = short_tmp / "project"
    workspace.mkdir()
    (workspace / "shapes.py").write_text("def area(width, height):\n    return width * height\n")
    stderr_path = short_tmp / "stderr.txt"
    with stderr_path.open("wb") as stderr:
        lsp = await RawLsp.start(server_command(short_tmp / "unused.sock", None), stderr=stderr, env=env)
        try:
            # enable off: no engine; a misspelled key: a warning; the workspace: an INFO line when it is indexed
            await lsp.initialize({"enable": False, "candidatez": 2}, root_uri=workspace.as_uri())
            messages = await _messages(lsp, 2)
            # a request the server cannot read: an error, which stderr carries
            lsp.send_raw(b'{"jsonrpc": "2.0", "id": 7, "method": "textDocument/completion", "params": 12}')
            await lsp.reply(7)
        finally:
            await lsp.stop()

    by_type = {params["type"]: str(params["message"]) for params in messages}
    assert "workspace index: 1 files" in by_type[types.MessageType.Info.value]
    assert "candidatez" in by_type[types.MessageType.Warning.value]
    log = (short_tmp / "xdg_state_home" / "diffgemma" / "lsp.log").read_text()
    assert "INFO diffgemma_lsp.repo.live: workspace index: 1 files" in log
    assert "WARNING diffgemma_lsp.server: diffgemma: unknown setting 'candidatez'" in log
    errors = stderr_path.read_text()
    assert "workspace index" not in errors and "candidatez" not in errors
    assert " INFO " not in errors and " WARNING " not in errors
    assert " ERROR pygls.protocol.json_rpc: Unable to deserialize message" in errors  # what the editor should show


async def test_its_own_state_folder_is_made_private_and_a_folder_the_user_named_is_left_as_it_is(
    short_tmp: Path,
) -> None:
    """The default log's folder (``$XDG_STATE_HOME/diffgemma``) is the project's: made 0700 when others could read
    it. A folder named by ``--log-file`` is the user's (``/tmp``, a project): only the file is made private."""
    env = dict(os.environ, **xdg_environment(short_tmp))
    state = short_tmp / "xdg_state_home" / "diffgemma"
    state.mkdir(mode=0o755)
    state.chmod(0o755)
    shared = short_tmp / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    for extra in ([], ["--log-file", str(shared / "lsp.log")]):
        lsp = await RawLsp.start([*server_command(short_tmp / "unused.sock", None), *extra], env=env)
        try:
            await lsp.initialize({"enable": False})
        finally:
            await lsp.stop()
    assert stat.S_IMODE(state.stat().st_mode) == 0o700
    assert stat.S_IMODE(shared.stat().st_mode) == 0o1777
    assert stat.S_IMODE((shared / "lsp.log").stat().st_mode) == 0o600
