"""Where the tests keep what they build once per machine rather than once per clone: the trained test checkpoints
and vLLM's CPU build (each keyed by what it is built from, so clones at different commits share it safely).

``DIFFGEMMA_TEST_CACHE`` names it; by default ``$XDG_CACHE_HOME/diffgemma-lsp-tests`` (``~/.cache/...``). The test
session sets the variable for the processes it starts (``tests/conftest.py``), so that a background build or a
test that moves ``XDG_CACHE_HOME`` into its temp dir still finds the same place. A fresh clone on a machine that
ran the tests before trains nothing and downloads nothing: before, each clone (a git worktree too) trained its five
checkpoints (about 9 CPU-minutes) and unpacked 3.5 GB of vLLM again."""

from __future__ import annotations

import os
from pathlib import Path

CACHE_ENV = "DIFFGEMMA_TEST_CACHE"


def cache_folder() -> Path:
    """The folder (``CACHE_ENV``, else under the user's cache folder), not created here."""
    named = os.environ.get(CACHE_ENV)
    if named:
        return Path(named)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "diffgemma-lsp-tests"


TEST_CACHE = cache_folder()
