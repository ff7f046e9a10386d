"""Issue 42, findings 5 and 6: what goes into a prompt is what the user would share. A workspace with a secret in
every form: files git ignores (a parent folder's ``.gitignore``, ``.git/info/exclude``, the global excludes file),
hidden files and folders, a link out of the workspace, a named pipe, secrets by name and by content, a pattern of the
``privateFiles`` setting. The index reads none of them and says why; each one's verdict holds for it as an open
document or a file the watcher reports."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from diffgemma_lsp.repo import privacy
from diffgemma_lsp.repo.files import NOT_REGULAR, LeftOut, read_source, workspace_files
from diffgemma_lsp.repo.index import WorkspaceIndex
from diffgemma_lsp.repo.privacy import Privacy
from tests.support.private_workspace import KEY_BLOCK, PRIVATE_FILES, SHARED, workspace  # noqa: F401  (the fixture)


def test_the_index_reads_only_what_the_user_would_share_and_says_why_it_left_the_rest_out(
    workspace: Path,  # noqa: F811
) -> None:
    index = WorkspaceIndex(privacy=Privacy(patterns=["customer_*"]))
    report = index.build([workspace])
    assert report.files == 1 and index.definitions_named("shared_function")
    left_out = {Path(entry.path).relative_to(workspace).as_posix(): entry.reason for entry in index.left_out}
    for name, (_, reason) in PRIVATE_FILES.items():
        where = "build_out" if name.startswith("build_out/") else name  # git names an ignored folder once
        assert left_out.get(where) == reason, (name, left_out)
    assert left_out["linked.py"] == privacy.OUTSIDE  # git lists no named pipe


def test_each_private_file_is_private_as_an_open_document_or_a_changed_file(workspace: Path) -> None:  # noqa: F811
    verdicts = Privacy([workspace], patterns=["customer_*"])
    assert verdicts.private(workspace / "main.py", SHARED) is None
    for name, (text, reason) in PRIVATE_FILES.items():
        assert verdicts.private(workspace / name, text) == reason, name
    assert verdicts.private(workspace / "linked.py") == privacy.OUTSIDE  # the link resolved
    home = workspace.parent.parent / "home"
    (home / ".aws").mkdir(parents=True)
    (home / ".aws" / "credentials").write_text("[default]\naws_secret_access_key = x\n")
    assert verdicts.private(home / ".aws" / "credentials") is not None
    assert verdicts.secret(home / ".aws" / "credentials") == privacy.SECRET_NAME
    assert verdicts.secret(workspace / "main.py", SHARED + KEY_BLOCK) == privacy.SECRET_TEXT


def test_a_named_pipe_is_never_read(workspace: Path) -> None:  # noqa: F811
    """Finding 3: reading a FIFO waited for a writer for good (the watcher's report of it hung a worker thread, and the
    language server never exited)."""
    assert read_source(workspace / "pipe.py") is None
    assert read_source(workspace / "linked.py") is None
    assert read_source(workspace / "main.py") == SHARED


def test_a_folder_deeper_than_the_stack_does_not_stop_the_walk(tmp_path: Path) -> None:
    """Finding 3: a folder 1,200 levels deep aborted the whole build ("maximum recursion depth exceeded")."""
    deep = tmp_path / "a_deep"
    os.mkdir(deep)
    descriptor = os.open(deep, os.O_RDONLY)
    try:
        for _ in range(1_300):  # relative to an open folder: the absolute path outgrows PATH_MAX
            os.mkdir("d", dir_fd=descriptor)
            inner = os.open("d", os.O_RDONLY, dir_fd=descriptor)
            os.close(descriptor)
            descriptor = inner
    finally:
        os.close(descriptor)
    (tmp_path / "z_after.py").write_text(SHARED)
    os.mkfifo(tmp_path / "pipe.py")
    left_out: list[LeftOut] = []
    try:
        found = [path.name for path in workspace_files(tmp_path, 100, Privacy([tmp_path]), left_out)]
    finally:
        remove_deep(deep)
    assert found == ["z_after.py"]
    assert left_out == [LeftOut(str(tmp_path / "pipe.py"), NOT_REGULAR)]


def remove_deep(top: Path) -> None:
    """Remove a chain of nested folders ``d`` one level at a time (shutil.rmtree recurses, as the walk did)."""
    level = 0
    while (top / "d").exists():
        moved = top.parent / f"level{level}"
        os.rename(top / "d", moved)
        shutil.rmtree(top)
        top, level = moved, level + 1
    shutil.rmtree(top)


def test_the_context_command_says_what_it_left_out_and_why(workspace: Path) -> None:  # noqa: F811
    """``diffgemma-lsp context`` shows what the model is sent, and now each file left out with its reason; in a
    secret file, that nothing is sent."""
    main = workspace / "main.py"
    command = [sys.executable, "-m", "diffgemma_lsp", "context", f"{main}:2:5", "--workspace", str(workspace), "--json"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, check=True)
    shown = json.loads(done.stdout)
    reasons = {entry["path"]: entry["reason"] for entry in shown["leftOut"]}
    assert reasons[".env"] == privacy.SECRET_NAME and reasons["keys.py"] == privacy.SECRET_TEXT
    assert reasons["excluded.py"] == privacy.IGNORED and reasons[".hidden.py"] == privacy.HIDDEN
    assert shown["refused"] is None and shown["prefix"].startswith("def shared_function")
    assert "customer_data.py" not in reasons  # the privateFiles setting is the user's: not known without it
    done = subprocess.run([*command, "--private", "customer_*.py"], capture_output=True, text=True, timeout=120)
    shown = json.loads(done.stdout)
    reasons = {entry["path"]: entry["reason"] for entry in shown["leftOut"]}
    assert reasons["customer_data.py"] == privacy.SETTING
    assert not any("named_by_the_setting" in chunk["text"] for chunk in shown["chunks"])
    secret = [sys.executable, "-m", "diffgemma_lsp", "context", f"{workspace / 'keys.py'}:1:1", "--workspace"]
    done = subprocess.run([*secret, str(workspace)], capture_output=True, text=True, timeout=120, check=True)
    assert f"nothing is sent for {workspace / 'keys.py'}: {privacy.SECRET_TEXT}" in done.stdout
    assert "b3BlbnNzaC1rZXktdjEAAAAA" not in done.stdout


ONE_PATTERN = re.compile(
    r"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----"
    r"|(?i:aws_secret_access_key|aws_session_token)\s*[=:]"
    r"|\bAKIA[0-9A-Z]{16}\b"
    r"|\bgh[pousr]_[A-Za-z0-9]{36,}\b"
    r"|\bxox[abpr]-[A-Za-z0-9-]{10,}"
)
"""The secrets by content as one pattern, as ``privacy.SECRET_CONTENT`` was written before it was split for speed:
what ``secret_text`` must still find, and only that."""


def test_a_secret_in_the_text_is_found_where_it_starts_a_word_and_only_there() -> None:
    key, github, slack = "AKIAIOSFODNN7EXAMPLE", "ghp_" + "a1" * 18, "xoxb-1234567890-abc"
    texts = [KEY_BLOCK, "AWS_Session_Token: x", "aws_secret_access_key  = y", key, github, slack, SHARED]
    texts += [f"{before}{secret}{after}" for secret in (key, github, slack) for before in ("", "x", "_", " ", "-", "é")
              for after in ("", "x", "Z", " ", "\n")]  # fmt: skip
    texts += ["xoxb-xoxb-1234567890", "AKIA" * 9, "ghp_" + "x" * 35, "aws_secret_access_key_id = 1"]
    texts += ["x" * 200 + slack + "y", "gh" * 500 + github]
    found = [text for text in texts if privacy.secret_text(text)]
    assert found == [text for text in texts if ONE_PATTERN.search(text)]
    assert KEY_BLOCK in found and f"x{key}" not in found and f"-{key}" in found and "xoxb-xoxb-1234567890" in found
