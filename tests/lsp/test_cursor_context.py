"""The definition of the name at or just before the cursor, on real tree-sitter grammars and a real index: read
from the cursor's line, resolved through the file's imports (Python, JavaScript/TypeScript, Go), ``self`` and a
class's methods, and sent last among the chunks, after the part of the prompt that stays put while typing."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from diffgemma_lsp.document import LineDocument
from diffgemma_lsp.repo.assembly import CURSOR_DEFINITION, RepoContext
from diffgemma_lsp.repo.bindings import Binding, bindings_of
from diffgemma_lsp.repo.cursor_names import chains_at
from diffgemma_lsp.repo.imports import import_statements
from diffgemma_lsp.repo.index import WorkspaceIndex
from diffgemma_lsp.session import Session
from diffgemma_lsp.settings import Settings

HELPERS = '''\
"""Helpers."""


class Retry:
    """Retries a call."""

    def __init__(self, times: int) -> None:
        self.times = times

    def run(self, call):
        """Run ``call`` until it works."""


def backoff(attempt: int) -> float:
    """Seconds to wait before ``attempt``."""
    return 2.0**attempt
'''

JOBS = """\
from . import helpers
import pkg.helpers as h


class Job:
    def go(self):
        pass

    def stop(self, now: bool) -> None:
        \"\"\"Stop the job.\"\"\"


def main():
    pass
"""


@pytest.mark.parametrize(
    ("language", "line", "expected"),
    [
        ("python", "        return helpers.Retry(", [("helpers", "Retry")]),
        ("python", "class Foo(base.Mixin", [("base", "Mixin"), ("Foo",)]),
        ("python", "    x = self.store.get(a, 'b.c'", [("self", "store", "get")]),
        ("python", "    x = make(a).value", [("", "value")]),
        ("python", "    # helpers.Retry", []),
        ("python", "    s = 'helpers.Retry'", []),
        ("typescript", "  const x = m.name", [("m", "name")]),
        ("javascript", "  this.x.foo(a, g(b), ", [("this", "x", "foo")]),
        ("go", "\tx := pkg.Name(", [("pkg", "Name")]),
        ("go", "\treturn s.conf.Get", [("s", "conf", "Get")]),
    ],
)
def test_the_names_at_the_cursor_are_read_from_its_line(language: str, line: str, expected: list) -> None:
    assert chains_at(line, len(line), language) == expected


def test_a_name_the_cursor_is_inside_counts_and_the_text_after_it_does_not() -> None:
    line = "    value = helpers.backoff(2) + other"
    assert chains_at(line, line.index("koff"), "python") == [("helpers", "backoff")]
    assert chains_at(line, line.index("(2") + 1, "python") == [("helpers", "backoff")]  # inside the call


def test_imports_bind_local_names_to_modules_and_their_names() -> None:
    python = "from . import a, b as c\nfrom ..x.y import (z as w,\n q)\nimport pkg.mod as m, os\nfrom .n import *\n"
    assert bindings_of(import_statements(python, "python"), "python") == [
        Binding("a", ".", "a"),
        Binding("c", ".", "b"),
        Binding("w", "..x.y", "z"),
        Binding("q", "..x.y", "q"),
        Binding("m", "pkg.mod", None),
        Binding("os", "os", None),
        Binding("*", ".n", "*"),
    ]
    script = "import * as m from './m';\nimport d, {a as b} from '../x'\nconst {r, s: t} = require('./r')\n"
    assert bindings_of(import_statements(script, "typescript"), "typescript") == [
        Binding("m", "./m", None),
        Binding("d", "../x", "default"),
        Binding("b", "../x", "a"),
        Binding("r", "./r", "r"),
        Binding("t", "./r", "s"),
    ]
    go = 'package x\n\nimport (\n\tcfg "example.com/app/config"\n\t"gopkg.in/yaml.v3"\n\t"example.com/b/v2"\n)\n'
    assert bindings_of(import_statements(go, "go"), "go") == [
        Binding("cfg", "example.com/app/config", None),
        Binding("yaml", "gopkg.in/yaml.v3", None),
        Binding("b", "example.com/b/v2", None),
    ]


def _workspace(root: Path, files: dict[str, str]) -> RepoContext:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    index = WorkspaceIndex()
    index.build([root])
    return RepoContext(index)


def _at_cursor(repo: RepoContext, path: Path, language: str, line: int, typed: str) -> list[tuple[str, str]]:
    """The chunks for the cursor at the end of ``typed``, written as line ``line`` of the file."""
    lines = path.read_text().splitlines(True)
    lines[line] = typed + "\n"
    text = "".join(lines)
    chunks = repo.cursor_chunks(str(path), text, text.splitlines(True), language, line, len(typed), 2048)
    assert all(chunk.origin == CURSOR_DEFINITION for chunk in chunks)
    return [(chunk.path, chunk.text) for chunk in chunks]


def test_a_python_module_attribute_a_class_with_its_init_and_a_method_of_self(tmp_path: Path) -> None:
    repo = _workspace(tmp_path, {"pkg/__init__.py": "", "pkg/helpers.py": HELPERS, "pkg/jobs.py": JOBS})
    jobs = tmp_path / "pkg" / "jobs.py"
    assert _at_cursor(repo, jobs, "python", 13, "    r = helpers.Retry(") == [
        (
            "pkg/helpers.py",
            'class Retry:\n    """Retries a call."""\n    def __init__(self, times: int) -> None:\n',
        )
    ]
    (only,) = _at_cursor(repo, jobs, "python", 12, "    return h.backoff")  # ``import pkg.helpers as h``
    assert only == (
        "pkg/helpers.py",
        'def backoff(attempt: int) -> float:\n    """Seconds to wait before ``attempt``."""\n',
    )
    (method,) = _at_cursor(repo, jobs, "python", 6, "        self.stop")
    assert method == (
        "pkg/jobs.py",
        'class Job:\n    def stop(self, now: bool) -> None:\n        """Stop the job."""\n',
    )
    (run,) = _at_cursor(repo, jobs, "python", 11, "    helpers.Retry.run")
    assert "    def run(self, call):\n" in run[1]
    assert _at_cursor(repo, jobs, "python", 10, "    unknown_name(") == []


def test_a_method_of_a_local_name_whose_class_the_code_says(tmp_path: Path) -> None:
    repo = _workspace(tmp_path, {"pkg/__init__.py": "", "pkg/helpers.py": HELPERS, "pkg/jobs.py": JOBS})
    jobs = tmp_path / "pkg" / "jobs.py"
    lines = JOBS.splitlines(True)
    lines[13] = "    retry = helpers.Retry(3)\n    retry.run\n"  # line 14: the cursor after ``retry.run``
    text = "".join(lines)
    chunks = repo.cursor_chunks(str(jobs), text, text.splitlines(True), "python", 14, len("    retry.run"), 2048)
    assert [chunk.text for chunk in chunks] == [
        'class Retry:\n    def run(self, call):\n        """Run ``call`` until it works."""\n'
    ]
    typed = "    def go(self, other: helpers.Retry) -> None:\n        other.run"
    lines = JOBS.splitlines(True)
    lines[13] = typed + "\n"
    text = "".join(lines)
    chunks = RepoContext(repo.index).cursor_chunks(
        str(jobs), text, text.splitlines(True), "python", 14, len("        other.run"), 2048
    )
    assert "    def run(self, call):" in chunks[0].text  # a parameter's annotation


def test_names_resolved_earlier_on_the_line_stay_the_newest_last(tmp_path: Path) -> None:
    repo = _workspace(tmp_path, {"pkg/__init__.py": "", "pkg/helpers.py": HELPERS, "pkg/jobs.py": JOBS})
    jobs = tmp_path / "pkg" / "jobs.py"
    _at_cursor(repo, jobs, "python", 13, "    wait = helpers.backoff(")
    (chunk,) = _at_cursor(repo, jobs, "python", 13, "    wait = helpers.backoff(2) * helpers.Retry")
    assert "def backoff" in chunk[1] and "class Retry:" in chunk[1]  # one file's, in its order
    (moved,) = _at_cursor(repo, jobs, "python", 12, "    helpers.Retry")
    assert "backoff" not in moved[1]  # another line: only what is written there


def test_javascript_namespace_and_named_imports(tmp_path: Path) -> None:
    shapes = "export function area(w: number, h: number): number {\n  return w * h;\n}\n\nexport class Box {}\n"
    main = "import * as shapes from './shapes';\nimport { area as size } from './shapes.js';\n\n\n"
    repo = _workspace(tmp_path, {"web/shapes.ts": shapes, "web/main.ts": main})
    path = tmp_path / "web" / "main.ts"
    assert _at_cursor(repo, path, "typescript", 3, "const a = shapes.area") == [
        ("web/shapes.ts", "export function area(w: number, h: number): number\n")
    ]
    boxed = "class Box {\n  open(lid: number): void {}\n}\n"
    (tmp_path / "web" / "box.ts").write_text(boxed)
    repo.index.index_text(str(tmp_path / "web" / "box.ts"), boxed)
    lines = (main + "import { Box } from './box';\nfunction f() {\n  const b = new Box();\n  b.open").splitlines(True)
    text = "".join(lines)
    chunks = repo.cursor_chunks(str(path), text, lines, "typescript", 7, len("  b.open"), 2048)
    assert [(chunk.path, chunk.text) for chunk in chunks] == [("web/box.ts", "class Box\n  open(lid: number): void\n")]
    assert _at_cursor(RepoContext(repo.index), path, "typescript", 3, "const b = size(") == [
        ("web/shapes.ts", "export function area(w: number, h: number): number\n")
    ]


def test_a_go_package_name_and_a_method_of_the_receiver(tmp_path: Path) -> None:
    config = (
        "package config\n\n// Load reads the file.\nfunc Load(path string) (*Config, error) {\n\treturn nil, nil\n}\n"
    )
    server = (
        'package server\n\nimport "example.com/app/config"\n\ntype Server struct{}\n\n'
        "// Start starts it.\nfunc (s *Server) Start() error {\n\treturn nil\n}\n\n"
        "func (s *Server) Run() {\n\n}\n"
    )
    repo = _workspace(tmp_path, {"config/config.go": config, "server/server.go": server})
    path = tmp_path / "server" / "server.go"
    assert _at_cursor(repo, path, "go", 12, "\tc, err := config.Load(") == [
        ("config/config.go", "// Load reads the file.\nfunc Load(path string) (*Config, error)\n")
    ]
    assert _at_cursor(RepoContext(repo.index), path, "go", 12, "\ts.Start") == [
        ("server/server.go", "// Start starts it.\nfunc (s *Server) Start() error\n")
    ]


def test_the_definitions_at_the_cursor_come_last_and_leave_the_chunks_before_them_as_they_were(
    tmp_path: Path,
) -> None:
    _workspace(tmp_path, {"pkg/__init__.py": "", "pkg/helpers.py": HELPERS, "pkg/jobs.py": JOBS})
    uri = (tmp_path / "pkg" / "jobs.py").as_uri()
    documents: dict[str, LineDocument] = {}
    session = Session(documents.get)
    session.repo.index.build([tmp_path])
    lines = JOBS.splitlines(True)
    settings = Settings()
    seen = []
    for typed in ("    x = 1", "    x = helpers.Retry("):
        documents[uri] = LineDocument(uri, "".join([*lines[:13], typed, "\n", *lines[14:]]), 1, "python")
        seen.append(session.context_chunks(settings, uri, 13, len(typed)))
    before, after = seen
    assert [chunk.origin for chunk in after][-1] == CURSOR_DEFINITION and "class Retry:" in after[-1].text
    assert after[: len(before)] == before  # what precedes them is the same as before the name was typed
    assert session.context_chunks(settings, uri, 13) == before  # no cursor column: none


def test_a_class_whose_init_does_not_fit_comes_alone(tmp_path: Path) -> None:
    arguments = ", ".join(f"a_rather_long_argument_name_number_{i}: int = 0" for i in range(6))
    big = f'class Settings:\n    """All of them."""\n\n    def __init__(self, {arguments}) -> None:\n        pass\n'
    repo = _workspace(tmp_path, {"pkg/__init__.py": "", "pkg/helpers.py": big, "pkg/jobs.py": JOBS})
    jobs = tmp_path / "pkg" / "jobs.py"
    assert _at_cursor(repo, jobs, "python", 13, "    s = helpers.Settings(") == [
        ("pkg/helpers.py", 'class Settings:\n    """All of them."""\n')
    ]


def test_one_overload_comes_when_all_of_them_do_not_fit(tmp_path: Path) -> None:
    overloads = "".join(
        f"export function zip<T{i}>(first: Array<T{i}>, second: Array<T{i}>, third: Array<T{i}>): Array<T{i}>;\n"
        for i in range(5)
    )
    repo = _workspace(tmp_path, {"zip.ts": overloads, "main.ts": "import { zip } from './zip';\n\n"})
    ((path, text),) = _at_cursor(repo, tmp_path / "main.ts", "typescript", 1, "const pairs = zip(")
    assert path == "zip.ts" and text == overloads.splitlines(True)[0]


def test_a_submodule_reached_through_its_package(tmp_path: Path) -> None:
    main = "import pkg\nfrom pkg import *\n\n\ndef main():\n    pass\n"
    repo = _workspace(tmp_path, {"pkg/__init__.py": "VERSION = 1\n", "pkg/helpers.py": HELPERS, "app.py": main})
    app = tmp_path / "app.py"
    ((path, text),) = _at_cursor(repo, app, "python", 5, "    wait = pkg.helpers.backoff")
    assert path == "pkg/helpers.py" and text.startswith("def backoff(attempt: int) -> float:")
