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
    assert {stat.S_IMODE(p.stat().st_mode) for p in path.parent.iterdir()} == {0o600}  # the new ones too
    assert "request 199" in path.read_text()  # the newest line is in the current file


def test_a_log_file_in_a_folder_that_is_there_leaves_the_folders_mode(tmp_path: Path) -> None:
    """``--log-file /tmp/engine.log``: the file is the user's alone, the folder keeps its mode (``/tmp`` made 0700
    shut every other user out of it); a folder that is not there is made 0700."""
    for mode in (0o1777, 0o755):
        shared = tmp_path / f"shared-{mode:o}"
        shared.mkdir()
        shared.chmod(mode)
        logfile.private_file_handler(shared / "engine.log").close()
        assert stat.S_IMODE(shared.stat().st_mode) == mode
        assert stat.S_IMODE((shared / "engine.log").stat().st_mode) == 0o600
    logfile.private_file_handler(tmp_path / "fresh" / "deeper" / "engine.log").close()
    assert stat.S_IMODE((tmp_path / "fresh" / "deeper").stat().st_mode) == 0o700
