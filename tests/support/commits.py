"""A git repository made for a test: one file, committed as ``before`` and then as ``after``."""

from __future__ import annotations

import subprocess
from pathlib import Path


def two_commits(folder: Path, name: str, before: str, after: str) -> Path:
    """``folder`` made a repository whose file ``name`` holds ``before`` in its first commit and ``after`` in its
    second."""
    folder.mkdir()
    (folder / name).write_text(before)
    git = ["git", "-C", str(folder), "-c", "user.name=t", "-c", "user.email=t@example.com"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", name], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "first"], check=True)
    (folder / name).write_text(after)
    subprocess.run([*git, "commit", "-q", "-am", "second"], check=True)
    return folder
