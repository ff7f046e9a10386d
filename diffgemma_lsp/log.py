"""Logging for the language server: its log file and the client's log window at each record's own level; stderr
only for errors. Never stdout (LSP talks there).

Editors show what a server writes to stderr as errors (Neovim's ``:LspLog`` marks every line ``[ERROR]``), so an
INFO line such as "engine ready" must not go there: it goes to the file and to ``window/logMessage`` as Info."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from lsprotocol import types
from pygls.lsp.server import LanguageServer

from diffgemma_engine.shared import logfile

LEVELS = {
    logging.ERROR: types.MessageType.Error,
    logging.WARNING: types.MessageType.Warning,
    logging.INFO: types.MessageType.Info,
}
LOG_FILE_NAME = "lsp.log"
"""The language server's log, in the state folder beside the engine's (``logfile.state_folder``)."""


def default_log_file() -> Path:
    """Where the language server logs when ``--log-file`` names no file."""
    return logfile.state_folder() / LOG_FILE_NAME


class WindowLogHandler(logging.Handler):
    """Forwards records to the client's log window (``window/logMessage``), pygls' own records excepted. A record
    logged on another thread (the workspace index's) is sent from the event loop's, as every other message is."""

    def __init__(self, server: LanguageServer) -> None:
        super().__init__(logging.DEBUG)
        self.server = server
        self._loop: asyncio.AbstractEventLoop | None = None

    def emit(self, record: logging.LogRecord) -> None:
        """Send one record, if the client is listening."""
        if record.name.startswith("pygls") or self.server.protocol.writer is None:
            return
        params = types.LogMessageParams(
            type=LEVELS.get(record.levelno, types.MessageType.Log), message=self.format(record)
        )
        try:
            self._loop = asyncio.get_running_loop()
        except RuntimeError:  # not the event loop's thread: hand it over (a shut loop drops it; the file has it)
            if self._loop is not None and not self._loop.is_closed():
                self._loop.call_soon_threadsafe(self._send, params, record)
            return
        self._send(params, record)

    def _send(self, params: types.LogMessageParams, record: logging.LogRecord) -> None:
        try:
            self.server.window_log_message(params)
        except Exception:  # noqa: BLE001 - logging must never break the server
            self.handleError(record)


def setup_logging(server: LanguageServer, level: str, log_file: Path | None) -> Path | None:
    """Configure the root logger for the language server process: the log file (``log_file``, else
    :func:`default_log_file`), the client's log window, and stderr for errors only. The file used, None when none
    could be made (said on stderr)."""
    window = WindowLogHandler(server)
    window.setFormatter(logging.Formatter("%(name)s: %(message)s"))
    # pygls logs every message body at INFO, document text included: keep that out unless debugging.
    pygls_level = logging.DEBUG if level.lower() == "debug" else logging.WARNING
    problem = None
    try:
        if log_file is None:  # the project's own folder: private (a folder the user names is theirs)
            log_file = default_log_file()
            logfile.private_folder(log_file.parent)
        file_handler: logging.Handler | None = logfile.private_file_handler(log_file)
    except OSError as exc:
        file_handler, problem = None, exc
    extra = [window] if file_handler is None else [file_handler, window]
    logfile.setup_logging(level, None, extra=extra, quiet={"pygls": pygls_level}, stderr_level=logging.ERROR)
    if problem is not None:
        logging.getLogger(__name__).error("cannot write the log file: %s", problem)
    return Path(file_handler.baseFilename) if isinstance(file_handler, logging.FileHandler) else None
