"""Logging for the language server: stderr, an optional file, and the client's log window. Never stdout."""

from __future__ import annotations

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


class WindowLogHandler(logging.Handler):
    """Forwards records to the client's log window (``window/logMessage``), pygls' own records excepted."""

    def __init__(self, server: LanguageServer) -> None:
        super().__init__(logging.INFO)
        self.server = server

    def emit(self, record: logging.LogRecord) -> None:
        """Send one record, if the client is listening."""
        if record.name.startswith("pygls") or self.server.protocol.writer is None:
            return
        try:
            self.server.window_log_message(
                types.LogMessageParams(
                    type=LEVELS.get(record.levelno, types.MessageType.Log), message=self.format(record)
                )
            )
        except Exception:  # noqa: BLE001 - logging must never break the server
            self.handleError(record)


def setup_logging(server: LanguageServer, level: str, log_file: Path | None) -> None:
    """Configure the root logger for the language server process: stderr, the file, the client's log window."""
    window = WindowLogHandler(server)
    window.setFormatter(logging.Formatter("%(name)s: %(message)s"))
    # pygls logs every message body at INFO, document text included: keep that out unless debugging.
    pygls_level = logging.DEBUG if level.lower() == "debug" else logging.WARNING
    logfile.setup_logging(level, log_file, extra=[window], quiet={"pygls": pygls_level})
