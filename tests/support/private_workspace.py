"""A workspace with a secret in every form (issue 42): a git repository whose workspace folder is ``repo/app``, with
files git ignores (a parent folder's ``.gitignore``, ``.git/info/exclude``, the global excludes file, an ignored
folder), hidden files and folders, secrets by name and by content, a file the ``privateFiles`` pattern
``customer_*`` names, a link out of the workspace and a named pipe."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from diffgemma_lsp.repo import privacy

KEY_BLOCK = "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA\n-----END OPENSSH PRIVATE KEY-----\n"
SHARED = "def shared_function():\n    return 1\n"
PRIVATE_FILES = {
    "ignored_by_parent.py": ("def ignored_by_parent(): pass\n", privacy.IGNORED),
    "excluded.py": ("def excluded_by_info(): pass\n", privacy.IGNORED),
    "globally.py": ("def ignored_globally(): pass\n", privacy.IGNORED),
    "build_out/gen.py": ("def in_an_ignored_folder(): pass\n", privacy.IGNORED),
    ".hidden.py": ("def hidden_file(): pass\n", privacy.HIDDEN),
    ".tools/helper.py": ("def in_a_hidden_folder(): pass\n", privacy.HIDDEN),
    ".env": ("API_TOKEN=dotenv-secret\n", privacy.SECRET_NAME),
    ".env.production": ("DB_PASSWORD=production-secret\n", privacy.SECRET_NAME),
    "id_ed25519": (KEY_BLOCK, privacy.SECRET_NAME),
    "server.pem": ("-----BEGIN CERTIFICATE-----\npem-secret\n", privacy.SECRET_NAME),
    "tls/server.key": ("key-file-secret\n", privacy.SECRET_NAME),
    "keys.py": (f'KEY = """\n{KEY_BLOCK}"""\ndef key_holder(): pass\n', privacy.SECRET_TEXT),
    "settings_aws.py": ('aws_secret_access_key = "aws-secret"\ndef aws_holder(): pass\n', privacy.SECRET_TEXT),
    "customer_data.py": ("def named_by_the_setting(): pass\n", privacy.SETTING),
}


def git(folder: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(folder), *args], check=True, capture_output=True)


@pytest.fixture
def workspace(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A repository whose workspace folder is ``repo/app`` (a parent folder's ``.gitignore`` applies to it)."""
    config = tmp_path / "gitconfig"
    excludes = tmp_path / "global-excludes"
    excludes.write_text("globally.py\n")
    config.write_text(f"[core]\n\texcludesFile = {excludes}\n")
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(config))
    repo = tmp_path / "repo"
    app = repo / "app"
    app.mkdir(parents=True)
    git(repo, "init", "-q")
    (repo / ".gitignore").write_text("ignored_by_parent.py\nbuild_out/\n")
    (repo / ".git" / "info" / "exclude").write_text("excluded.py\n")
    (app / "main.py").write_text(SHARED)
    for name, (text, _) in PRIVATE_FILES.items():
        (app / name).parent.mkdir(parents=True, exist_ok=True)
        (app / name).write_text(text)
    outside = tmp_path / "elsewhere" / "private.py"
    outside.parent.mkdir()
    outside.write_text("def outside_the_workspace(): pass\n")
    (app / "linked.py").symlink_to(outside)
    os.mkfifo(app / "pipe.py")
    return app


NAMES = [
    "ignored_by_parent",
    "excluded_by_info",
    "ignored_globally",
    "in_an_ignored_folder",
    "hidden_file",
    "in_a_hidden_folder",
    "key_holder",
    "aws_holder",
    "named_by_the_setting",
    "outside_the_workspace",
]
"""The definitions of the private files: the code in main.py calls each (the workspace context looks them up)."""
MARKERS = [
    *(f"def {name}" for name in NAMES),
    "dotenv-secret",
    "production-secret",
    "b3BlbnNzaC1rZXktdjEAAAAA",
    "pem-secret",
    "key-file-secret",
    "aws-secret",
    "EDITED_IN_THE_EDITOR",
    "credentials-at-home",
]
MAIN = "def total():\n" + "".join(f"    {name}()\n" for name in [*NAMES, "shared_helper"]) + "    return "


def with_main_and_credentials(workspace: Path) -> Path:
    """``main.py`` (``MAIN``) and a shared helper in ``workspace``, and a credentials file in the home folder beside
    the repository (outside the workspace); the credentials file's path."""
    home = workspace.parent.parent / "home"
    (home / ".aws").mkdir(parents=True)
    credentials = home / ".aws" / "credentials"
    credentials.write_text("[default]\naws_secret_access_key = credentials-at-home\n")
    (workspace / "main.py").write_text(MAIN)
    (workspace / "helpers.py").write_text("def shared_helper():\n    return 2\n")
    return credentials
