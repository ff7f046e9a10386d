"""What the user would not share: the files that never go into a prompt, open or not, and why.

A file is private when git ignores it (every ``.gitignore`` up to the repository's root, ``.git/info/exclude``, the
global excludes file: git itself is asked, where the workspace is a repository), when it or a folder it is in is
hidden (a name starting with a dot), when it lies outside the workspace folders once its links are resolved, or when
it is a secret: by its name (``.env*``, private keys, credential stores, the ``*.pem``/``*.key`` family, and the
patterns of the ``privateFiles`` setting) or by its content (a private-key block, a cloud credential).

A secret is never sent at all, not even for completions in itself; the other private files are completed in (the
user is editing them) but never go into another file's prompt.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Iterable, Sequence
from pathlib import Path

import pathspec

SECRET_NAMES = (
    ".env",
    ".env.*",
    "*.env",
    ".envrc",
    "*.pem",
    "*.key",
    "*.p12",
    "*.pfx",
    "*.jks",
    "*.keystore",
    "*.kdbx",
    "*.ppk",
    "id_rsa*",
    "id_dsa*",
    "id_ecdsa*",
    "id_ed25519*",
    "*.asc",
    "*.gpg",
    ".netrc",
    "_netrc",
    ".pgpass",
    ".npmrc",
    ".pypirc",
    ".git-credentials",
    ".htpasswd",
    ".aws/credentials",
    ".aws/config",
    "credentials",
    "credentials.json",
    "*.tfvars",
    "*.tfstate",
    "service-account*.json",
)
"""Files that hold secrets by their name (gitignore patterns: a name alone matches in any folder)."""
SECRET_CONTENT = (
    (re.compile(r"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----"), False),
    (re.compile(r"(?i:aws_s(?:ecret_access_key|ession_token))\s*[=:]"), False),
    (re.compile(r"AKIA[0-9A-Z]{16}\b"), True),
    (re.compile(r"gh[pousr]_[A-Za-z0-9]{36,}\b"), True),
    (re.compile(r"xox[abpr]-[A-Za-z0-9-]{10,}"), True),
)
"""Text that is a secret wherever it is: a private-key block, an AWS key or token, a GitHub or Slack token; each with
whether it must start a word. One pattern each, each starting with its literal, which ``re`` finds at the speed of a
substring search: one pattern of them all in alternation tried each alternative at every character (1.1 s on a
minified file's 20 MB line, 2.5 s on 30 MB of code; 0.12 s and 0.19 s this way)."""
_WORD_CHARACTER = re.compile(r"\w")

IGNORED = "ignored by git"
HIDDEN = "hidden"
OUTSIDE = "outside the workspace folders"
SECRET_NAME = "a secret by its name"
SECRET_TEXT = "holds a private key or a credential"
SETTING = "named by the privateFiles setting"
MAX_KNOWN = 4_096
"""Paths whose verdict is kept (a verdict asks git: a process), and folders known to be in no repository."""
GIT_TIMEOUT_S = 10.0
MAX_IGNORE_FILE_BYTES = 512 * 1024
"""A larger ``.gitignore`` is not read."""


def secret_text(text: str) -> bool:
    """Whether ``text`` holds a secret (``SECRET_CONTENT``)."""
    return any(_found(pattern, text, starts_word) for pattern, starts_word in SECRET_CONTENT)


def _found(pattern: re.Pattern[str], text: str, starts_word: bool) -> bool:
    """Whether ``pattern`` is in ``text``, at the start of a word where ``starts_word`` (a ``\\b`` before it would
    cost ``re`` its substring search)."""
    at = 0
    while (match := pattern.search(text, at)) is not None:
        if not starts_word or match.start() == 0 or not _WORD_CHARACTER.match(text, match.start() - 1):
            return True
        at = match.start() + 1
    return False


class Privacy:
    """The verdicts for the workspace folders ``roots`` and the user's own patterns."""

    def __init__(self, roots: Iterable[Path] = (), patterns: Sequence[str] = ()) -> None:
        self.roots: list[Path] = []
        self._secret_names = pathspec.GitIgnoreSpec.from_lines(SECRET_NAMES)
        self._patterns = pathspec.GitIgnoreSpec.from_lines(patterns)
        self._pattern_lines = tuple(patterns)
        self.patterns_version = 0
        """Counts the changes of the ``privateFiles`` patterns (a walk made before one is checked again)."""
        self._known: dict[str, str | None] = {}
        self.set_roots(roots)

    def set_roots(self, roots: Iterable[Path]) -> None:
        """The workspace folders (a file outside all of them is private); none: no file is outside."""
        resolved = [Path(os.path.realpath(root)) for root in roots]
        if resolved != self.roots:
            self.roots = resolved
            self._known.clear()

    def add_roots(self, roots: Iterable[Path]) -> None:
        self.set_roots([*self.roots, *(root for root in roots if Path(os.path.realpath(root)) not in self.roots)])

    def set_patterns(self, patterns: Sequence[str]) -> bool:
        """The ``privateFiles`` setting: more gitignore patterns of files never sent. Whether they changed."""
        if tuple(patterns) == self._pattern_lines:
            return False
        self._patterns = pathspec.GitIgnoreSpec.from_lines(patterns)
        self._pattern_lines = tuple(patterns)
        self.patterns_version += 1
        self._known.clear()
        return True

    def root_of(self, path: Path) -> Path | None:
        """The workspace folder ``path`` (resolved) is in, or None."""
        return next((root for root in self.roots if path.is_relative_to(root)), None)

    def secret(self, path: str | Path, text: str | None = None) -> str | None:
        """Why ``path`` (with its ``text``, where known) is a secret, or None: by its name, by the user's patterns,
        by its content."""
        resolved = Path(os.path.realpath(path))
        root = self.root_of(resolved)
        relative = resolved.relative_to(root).as_posix() if root is not None else resolved.name
        for name in {relative, Path(path).name, resolved.name, "/".join(resolved.parts[-2:])}:
            if self._patterns.match_file(name):
                return SETTING
            if self._secret_names.match_file(name):
                return SECRET_NAME
        if text is not None and secret_text(text):
            return SECRET_TEXT
        return None

    def private(self, path: str | Path, text: str | None = None) -> str | None:
        """Why ``path`` must not go into another file's prompt, or None: a secret, ignored by git, hidden, outside
        the workspace folders."""
        key = str(path)
        if key not in self._known:
            if len(self._known) >= MAX_KNOWN:
                self._known.clear()
            self._known[key] = self.private_by_path(Path(path))
        reason = self._known[key]
        if reason is None and text is not None and secret_text(text):
            return SECRET_TEXT
        return reason

    def private_by_path(self, path: Path, ask_git: bool = True) -> str | None:
        """:meth:`private` by the path alone; ``ask_git`` False: git was asked already (a file it lists)."""
        if (reason := self.secret(path)) is not None:
            return reason
        resolved = Path(os.path.realpath(path))
        root = self.root_of(resolved)
        if self.roots and root is None:
            return OUTSIDE
        parts = resolved.relative_to(root).parts if root is not None else resolved.parts
        if any(part.startswith(".") for part in parts):
            return HIDDEN
        if ask_git and ignored_by_git(resolved, root):
            return IGNORED
        return None


_outside_git: set[Path] = set()
"""Folders git said are in no repository: not asked again for each of their files."""


def ignored_by_git(path: Path, root: Path | None) -> bool:
    """Whether git ignores ``path``: git itself is asked where the file is in a repository (``git check-ignore``:
    every ``.gitignore`` up to the repository's root, ``.git/info/exclude``, the global excludes file); elsewhere the
    ``.gitignore`` files from ``root`` down to the file's folder are read, as the walk reads them."""
    folder = path.parent
    done = None
    if folder not in _outside_git:
        try:
            done = subprocess.run(
                ["git", "-C", str(folder), "check-ignore", "-q", "--", str(path)],
                capture_output=True,
                timeout=GIT_TIMEOUT_S,
                check=False,
            )
        except (OSError, subprocess.SubprocessError):
            done = None
        if done is not None and done.returncode in (0, 1):
            return done.returncode == 0
        if len(_outside_git) >= MAX_KNOWN:
            _outside_git.clear()
        _outside_git.add(folder)  # no repository there (or no git): the .gitignore files are read
    top = root if root is not None else folder
    for base in [folder for folder in reversed(path.parents) if folder.is_relative_to(top)]:
        spec = gitignore_of(base)
        if spec is not None and spec.match_file(path.relative_to(base).as_posix()):
            return True
    return False


def gitignore_of(folder: Path) -> pathspec.GitIgnoreSpec | None:
    """The folder's own ``.gitignore`` (not a link, not oversized), or None."""
    path = folder / ".gitignore"
    try:
        if path.is_symlink() or path.stat().st_size > MAX_IGNORE_FILE_BYTES:
            return None
        return pathspec.GitIgnoreSpec.from_lines(path.read_text(errors="replace").splitlines())
    except OSError:
        return None


def git_listing(root: Path) -> tuple[list[Path], list[Path]] | None:
    """Where ``root`` is in a git repository: (the files git would commit there: tracked, and untracked but not
    ignored; the ignored files and folders, a folder once), as absolute paths; None elsewhere (or without git)."""

    def listed(*options: str) -> list[Path] | None:
        try:
            done = subprocess.run(
                ["git", "-C", str(root), "ls-files", "-z", *options],
                capture_output=True,
                timeout=GIT_TIMEOUT_S * 6,
                check=False,
            )
        except (OSError, subprocess.SubprocessError):
            return None
        if done.returncode != 0:
            return None
        names = done.stdout.decode("utf-8", "surrogateescape").split("\0")
        return [root / name.rstrip("/") for name in names if name]

    shared = listed("--cached", "--others", "--exclude-standard")
    if shared is None:
        return None
    ignored = listed("--others", "--ignored", "--exclude-standard", "--directory") or []
    return shared, ignored
