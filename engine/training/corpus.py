"""Source files present on a fresh machine, as a deduplicated training corpus.

Only code that every machine of this kind has (the Python standard library, installed packages, system
headers) goes in. Never the benchmark data under ``../shared/data``.
"""

from __future__ import annotations

import hashlib
import sys
import sysconfig
from collections.abc import Iterator
from pathlib import Path

EXTENSIONS = {
    ".py": "python",
    ".c": "c",
    ".h": "c",
    ".js": "javascript",
    ".ts": "typescript",
    ".go": "go",
    ".rs": "rust",
    ".lua": "lua",
    ".sh": "shell",
}
MAX_FILE_BYTES = 200_000
FORBIDDEN_PARTS = ("shared/data", "humaneval")


def default_roots() -> list[Path]:
    """Where source code lives on this machine."""
    paths = sysconfig.get_paths()
    roots = [
        Path(paths["stdlib"]),
        Path(paths["purelib"]),
        Path("/usr/include"),
        Path("/usr/lib/node_modules"),
    ]
    rustup = Path.home() / ".rustup"
    if rustup.is_dir():
        roots.append(rustup)
    return [root for root in roots if root.is_dir() and not str(root).startswith(sys.prefix + "/src")]


def iter_sources(roots: list[Path], seen: set[str] | None = None) -> Iterator[tuple[Path, str]]:
    """Yield (path, text) for each distinct source file under ``roots``, skipping exact duplicates."""
    seen = set() if seen is None else seen
    for root in roots:
        for path in sorted(root.rglob("*")):
            if path.suffix not in EXTENSIONS or any(part in str(path) for part in FORBIDDEN_PARTS):
                continue
            try:
                if not path.is_file() or path.stat().st_size > MAX_FILE_BYTES:
                    continue
                text = path.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError):
                continue
            digest = hashlib.sha1(text.encode()).hexdigest()
            if digest in seen or not text.strip():
                continue
            seen.add(digest)
            yield path, text


def is_held_out(path: Path) -> bool:
    """A stable 2% of files, by path hash, for held-out evaluation."""
    return int(hashlib.md5(str(path).encode()).hexdigest(), 16) % 50 == 0
