"""Headless Neovim as the editor tests start it: no user config, no shada, no swap files, the project's plugin
(editors/neovim) on the runtimepath."""

from __future__ import annotations

from pathlib import Path

PLUGIN = Path(__file__).resolve().parents[2] / "editors" / "neovim"


def headless_command(nvim: str, script: Path) -> list[str]:
    """``nvim`` headless with the plugin on its runtimepath, running the Lua file ``script``."""
    return [
        nvim,
        "--headless",
        "-u",
        "NONE",
        "-i",
        "NONE",
        "-n",
        "--cmd",
        f"set rtp+={PLUGIN}",
        "-c",
        f"luafile {script}",
    ]
