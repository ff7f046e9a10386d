"""The definition of the name at the cursor (issue 43) respects what the user would not share (issue 42): a name
defined only in an ignored, hidden, secret or outside file, or one the ``privateFiles`` setting names, brings no
definition to the prompt, whether reached through an import or by its name alone; a shared one does."""

from __future__ import annotations

from pathlib import Path

import pytest

from diffgemma_lsp.document import LineDocument
from diffgemma_lsp.repo.assembly import CURSOR_DEFINITION
from diffgemma_lsp.server import DiffgemmaServer
from diffgemma_lsp.session import Session
from diffgemma_lsp.settings import Settings
from tests.support.private_workspace import PRIVATE_FILES, workspace  # noqa: F401  (the fixture)

PRIVATE_NAMES = {
    "ignored_by_parent.py": "ignored_by_parent",
    "excluded.py": "excluded_by_info",
    "globally.py": "ignored_globally",
    "build_out/gen.py": "in_an_ignored_folder",
    ".hidden.py": "hidden_file",
    ".tools/helper.py": "in_a_hidden_folder",
    "keys.py": "key_holder",
    "settings_aws.py": "aws_holder",
    "customer_data.py": "named_by_the_setting",
    "linked.py": "outside_the_workspace",
}
"""Each private Python file of the workspace and the function it defines."""


def _cursor_chunks(session: Session, folder: Path, typed: str) -> list[str]:
    use = folder / "use.py"
    text = f"import main\n\n\ndef use():\n{typed}\n"
    documents = {use.as_uri(): LineDocument(use.as_uri(), text, 1, "python")}
    session.open_document = documents.get  # type: ignore[method-assign]
    settings = Settings(private_files=("customer_*",))
    session.repo.context.forget(str(use))  # the names resolved earlier on the line are not kept
    line = text.count("\n") - 1
    chunks = session.context_chunks(settings, use.as_uri(), line, len(typed.splitlines()[-1]))
    return [chunk.path for chunk in chunks if chunk.origin == CURSOR_DEFINITION]


def _session(folder: Path, patterns: tuple[str, ...]) -> Session:
    """The server's session, its index built with the ``privateFiles`` ``patterns``, then the setting changed to
    ``customer_*`` as the editor changes it (``workspace/didChangeConfiguration``)."""
    server = DiffgemmaServer()
    server.apply_settings({"privateFiles": list(patterns)})
    server.session.repo.index.build([folder])
    server.apply_settings({"privateFiles": ["customer_*"]})
    return server.session


@pytest.mark.parametrize("patterns_when_built", [("customer_*",), ()])
def test_no_definition_at_the_cursor_comes_from_a_private_file(
    workspace: Path,  # noqa: F811
    patterns_when_built: tuple[str, ...],
) -> None:
    """Built with the ``privateFiles`` patterns, or given them after the index was built (the setting changed)."""
    assert set(PRIVATE_NAMES) <= {*PRIVATE_FILES, "linked.py"}
    (workspace / "use.py").write_text("")
    session = _session(workspace, patterns_when_built)
    assert _cursor_chunks(session, workspace, "    x = main.shared_function(") == ["main.py"]  # it can fail
    for path, name in PRIVATE_NAMES.items():
        module = path.removesuffix(".py").replace("/", ".")
        for typed in (f"    x = {name}(", f"    import {module}\n    x = {module}.{name}("):
            assert _cursor_chunks(session, workspace, typed) == [], (path, typed)


def test_a_privatefiles_pattern_given_while_the_index_builds_keeps_what_it_names_out(tmp_path: Path) -> None:
    """Neovim sends its settings after ``initialized``, while the first build runs: the files the pattern names
    that the build had not read yet are not indexed, and those it had read leave (one file read, then the
    setting, as the build's own progress callback gives it)."""
    for name in ("a_first.py", "customer_data.py", "customer_more.py", "z_last.py"):
        (tmp_path / name).write_text(f"def {name.removesuffix('.py')}(): pass\n")
    server = DiffgemmaServer()
    index = server.session.repo.index

    def progress(done: int, found: int) -> None:
        if done == 1:
            server.apply_settings({"privateFiles": ["customer_*"]})

    index.build([tmp_path], progress=progress)
    names = ("a_first", "customer_data", "customer_more", "z_last")
    assert [name for name in names if index.definitions_named(name)] == ["a_first", "z_last"]
