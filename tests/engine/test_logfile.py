"""The log files every process writes: private, and bounded (rotated) however long the process lives."""

from __future__ import annotations

import logging
import stat
from pathlib import Path

from diffgemma_engine.shared import logfile


def test_a_log_file_is_rotated_past_its_size_and_keeps_a_bounded_number_of_backups(tmp_path: Path) -> None:
    path = tmp_path / "state" / "lsp.log"
    handler = logfile.private_file_handler(path, max_bytes=400)
    logger = logging.getLogger("test_logfile")
    logger.propagate = False
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        for number in range(200):
            logger.info("request %03d answered in 12.5 ms, 8 steps", number)
    finally:
        logger.removeHandler(handler)
        handler.close()
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    kept = sorted(p.name for p in path.parent.iterdir())
    assert kept == ["lsp.log", *(f"lsp.log.{n}" for n in range(1, logfile.LOG_BACKUPS + 1))]
    assert all(p.stat().st_size <= 400 for p in path.parent.iterdir())
    assert "request 199" in path.read_text()  # the newest line is in the current file
