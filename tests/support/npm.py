"""npm in the VS Code extension's folder, for the tests that build it or drive it."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXTENSION = ROOT / "editors" / "vscode"
REQUIRE_NODE_ENV = "DIFFGEMMA_REQUIRE_NODE"


def npm_or_skip() -> str:
    """npm's path; skips without it, unless DIFFGEMMA_REQUIRE_NODE=1 makes that a failure."""
    npm = shutil.which("npm")
    if npm is None or shutil.which("node") is None:
        why = "node/npm are not on PATH (Node 20+ builds and tests editors/vscode)"
        if os.environ.get(REQUIRE_NODE_ENV) == "1":
            pytest.fail(f"{why}, and {REQUIRE_NODE_ENV}=1 requires them")
        pytest.skip(f"{why}; set {REQUIRE_NODE_ENV}=1 to fail instead")
    return npm


def run_npm(npm: str, *args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    """``npm ARGS`` in editors/vscode; fails the test with its output when it fails."""
    env = dict(os.environ, PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD="1", NO_UPDATE_NOTIFIER="1")
    proc = subprocess.run(
        [npm, *args],
        cwd=EXTENSION,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 0, f"npm {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    return proc


def ensure_node_modules(npm: str) -> None:
    """``npm ci`` when node_modules is missing or older than package-lock.json."""
    modules = EXTENSION / "node_modules"
    lock = EXTENSION / "package-lock.json"
    if not modules.is_dir() or modules.stat().st_mtime < lock.stat().st_mtime:
        run_npm(npm, "ci", "--no-audit", "--no-fund", timeout=600)
        modules.touch()
