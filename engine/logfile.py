"""Log files that only their owner can read: logs hold request ids and timings, and with ``-v`` document text."""

from __future__ import annotations

import logging
import os
from pathlib import Path


def private_file_handler(path: Path | str) -> logging.FileHandler:
    """A handler appending to ``path`` (``~`` expanded, folders made), the file created 0600 if it is new."""
    path = Path(path).expanduser()
    path.parent.mkdir(parents=True, exist_ok=True)
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600))
    return logging.FileHandler(path)
