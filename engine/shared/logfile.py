"""Logging for every process of the project (the engine, the language server, the OpenAI endpoint): stderr and an
optional file only their owner can read, never stdout (the language server speaks LSP there). Logs hold request
ids and timings, and with ``-v`` document text."""

from __future__ import annotations

import logging
import logging.handlers
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def state_folder() -> Path:
    """The folder of the project's logs: ``$XDG_STATE_HOME/diffgemma``, by default ``~/.local/state/diffgemma``."""
    return Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state") / "diffgemma"


def private_folder(folder: Path) -> Path:
    """``folder`` made if missing (its parents too), readable by this user alone: the logs hold document text with
    ``-v``. An existing one of this user's that others can read is made private too."""
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    info = folder.stat()
    if info.st_uid == os.getuid() and info.st_mode & 0o077:
        folder.chmod(0o700)
    return folder


MAX_LOG_BYTES = 10 * 1024 * 1024
"""A log file's size when it is rotated (renamed with a ``.1`` suffix, a new one begun): a resident process logs a
line or two per request, and the language server's log is written by default, so without a bound it grew for good."""
LOG_BACKUPS = 2
"""The rotated files kept beside the current one."""


def private_file_handler(path: Path | str, max_bytes: int = MAX_LOG_BYTES) -> logging.FileHandler:
    """A handler appending to ``path`` (``~`` expanded), the file created 0600 if it is new and rotated past
    ``max_bytes`` (:data:`LOG_BACKUPS` kept); ``OSError`` where it cannot be written (a folder of that name, no
    permission). A missing folder is made 0700; one that is there is left as it is: a folder the user named
    (``--log-file /tmp/engine.log``, a project's) is theirs, and ``/tmp`` made 0700 shut every other user out of
    it. The project's own state folder is made private by whoever logs there (``private_folder``)."""
    path = Path(path).expanduser()
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    create_private(path)
    handler = logging.handlers.RotatingFileHandler(path, maxBytes=max_bytes, backupCount=LOG_BACKUPS)
    handler.rotator = _rotate_private
    return handler


def create_private(path: Path | str) -> None:
    """``path`` created 0600 if it is not there, left as it is if it is (a log file before a handler opens it);
    ``OSError`` where it cannot be (a folder of that name, no permission)."""
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600))


def _rotate_private(source: str, dest: str) -> None:
    """The rotation's rename, then the new current file made 0600 before the handler opens it (it would make it
    with the process's umask, readable by others in a folder they can enter)."""
    os.replace(source, dest)
    create_private(source)


def setup_logging(
    level: str,
    log_file: Path | None,
    *,
    extra: Sequence[logging.Handler] = (),
    quiet: Mapping[str, int] | None = None,
    stderr_level: int = logging.NOTSET,
) -> None:
    """The root logger at ``level`` (a name: ``info``, ``DEBUG``), writing to stderr, to ``log_file`` when given
    (created 0600) and to the ``extra`` handlers, each in :data:`FORMAT` unless it has its own formatter; the
    loggers named in ``quiet`` at the level given there (other libraries' chatter). Stderr takes only the records
    at ``stderr_level`` and above (the language server's editor shows what it writes there as errors)."""
    stderr = logging.StreamHandler(sys.stderr)
    stderr.setLevel(stderr_level)
    handlers: list[logging.Handler] = [stderr]
    if log_file is not None:
        handlers.append(private_file_handler(log_file))
    handlers += extra
    for handler in handlers:
        if handler.formatter is None:
            handler.setFormatter(logging.Formatter(FORMAT))
    logging.basicConfig(level=getattr(logging, level.upper()), handlers=handlers, force=True)
    for name, quiet_level in (quiet or {}).items():
        logging.getLogger(name).setLevel(quiet_level)
