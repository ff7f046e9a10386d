"""Logging for the language server: stderr, an optional file, and the client's log window. Never stdout."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

from lsprotocol import types
from pygls.lsp.server import LanguageServer

from diffgemma_engine.logfile import private_file_handler

FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
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
    """Configure the root logger for the language server process."""
    handlers: list[logging.Handler] = [logging.StreamHandler(sys.stderr), WindowLogHandler(server)]
    if log_file is not None:
        handlers.append(private_file_handler(log_file))
    for handler in handlers:
        handler.setFormatter(
            logging.Formatter("%(name)s: %(message)s" if isinstance(handler, WindowLogHandler) else FORMAT)
        )
    logging.basicConfig(level=getattr(logging, level.upper()), handlers=handlers, force=True)
    # pygls logs every message body at INFO, document text included: keep that out unless debugging.
    logging.getLogger("pygls").setLevel(logging.DEBUG if level.lower() == "debug" else logging.WARNING)
