"""Start the engine as a detached process that outlives this language server and serves every window."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

logger = logging.getLogger(__name__)

IDLE_EXIT_S = 900
"""An engine started here exits after this long without any client."""


def engine_log_path() -> Path:
    """Where a started engine writes its log."""
    base = Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state")
    return base / "diffgemma" / "engine.log"


def engine_command(socket_path: Path, model: str | None, device: str) -> list[str]:
    """The command line of an engine for ``socket_path``."""
    command = [
        sys.executable,
        "-m",
        "engine",
        "--log-file",
        str(engine_log_path()),
        "serve",
        "--socket",
        str(socket_path),
        "--device",
        device,
        "--idle-exit",
        str(IDLE_EXIT_S),
        "--exist-ok",
    ]
    if model:
        command += ["--model", str(Path(model).expanduser())]
    return command


def spawn_engine(socket_path: Path, model: str | None, device: str) -> subprocess.Popen[bytes]:
    """Start an engine in its own session; its stdout never reaches the LSP's stdout."""
    command = engine_command(socket_path, model, device)
    logger.info("starting engine: %s", " ".join(command))
    log = engine_log_path()
    log.parent.mkdir(parents=True, exist_ok=True)
    return subprocess.Popen(
        command,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        close_fds=True,
    )
