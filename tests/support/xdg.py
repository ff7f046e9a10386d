"""The XDG folders a test gives the processes it starts, inside a folder of its own."""

from __future__ import annotations

from pathlib import Path


def xdg_environment(root: Path) -> dict[str, str]:
    """XDG directories made inside ``root``, as environment variables."""
    env = {}
    for name in ("XDG_RUNTIME_DIR", "XDG_STATE_HOME", "XDG_CACHE_HOME", "XDG_CONFIG_HOME", "XDG_DATA_HOME"):
        path = root / name.lower()
        path.mkdir(mode=0o700, exist_ok=True)
        env[name] = str(path)
    return env
