"""The workspace index on real tree-sitter grammars: definitions, the files it reads, imports, the assembled chunks,
and ``diffgemma-lsp context``."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from diffgemma_lsp import grammars
from diffgemma_lsp.repo import assembly, live
from diffgemma_lsp.repo.assembly import DEFINITION, SNIPPET, RepoContext, identifiers_near
from diffgemma_lsp.repo.definitions import definitions_of
from diffgemma_lsp.repo.files import MAX_FILE_BYTES, read_source, workspace_files
from diffgemma_lsp.repo.imports import imports_of
from diffgemma_lsp.repo.index import WorkspaceIndex
from diffgemma_lsp.repo.privacy import Privacy
from diffgemma_lsp.repo.snippets import SnippetIndex, tokens_of, windows_of

GEOMETRY = '''\
"""Shapes."""

UNIT = 1.0


class Rectangle:
    """An axis-aligned rectangle."""

    def __init__(self, width: float, height: float) -> None:
        self.width = width
        self.height = height

    def scaled(self, factor: float) -> "Rectangle":
        """A copy, each side times ``factor``."""
        return Rectangle(self.width * factor, self.height * factor)


def area(width: float,
         height: float) -> float:
    """Width times height."""
    def inner() -> None:
        pass
    return width * height
'''

MAIN = """\
from shapes.geometry import area, Rectangle


def total(rectangles):
    result = 0.0
    for r in rectangles:
        result += area(
"""


def write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))


def test_python_definitions_have_their_header_doc_and_class() -> None:
    found = {(d.name, d.line): d for d in definitions_of(GEOMETRY, "python", "geometry.py")}
    assert set(found) == {("UNIT", 2), ("Rectangle", 5), ("__init__", 8), ("scaled", 12), ("area", 17), ("inner", 20)}
    area = found["area", 17]
    assert area.signature == "def area(width: float,\n         height: float) -> float:"
    assert area.doc == '"""Width times height."""' and not area.doc_above and area.parent == ""
    scaled = found["scaled", 12]
    assert scaled.signature == '    def scaled(self, factor: float) -> "Rectangle":'
    assert scaled.parent == "class Rectangle:" and scaled.parent_line == 5
    assert found["inner", 20].parent.strip() == "def area(width: float,"
    assert found["UNIT", 2].kind == "constant" and found["UNIT", 2].signature == "UNIT = 1.0"


@pytest.mark.parametrize(
    ("language", "source", "expected"),
    [
        (
            "go",
            "package m\n\n// Sum adds.\nfunc Sum(a, b int) int {\n\treturn a + b\n}\n",
            ("Sum", "func Sum(a, b int) int", "// Sum adds."),
        ),
        (
            "c",
            "/* sums */\nint sum(int a, int b)\n{\n  return a + b;\n}\n",
            ("sum", "int sum(int a, int b)", "/* sums */"),
        ),
        ("rust", "/// Adds.\npub fn add(a: u8) -> u8 { a }\n", ("add", "pub fn add(a: u8) -> u8", "/// Adds.")),
        (
            "typescript",
            "// A shape.\nexport interface Shape {\n  area(): number;\n}\n",
            ("Shape", "export interface Shape", "// A shape."),
        ),
        ("javascript", "function add(a, b) {\n  return a + b;\n}\n", ("add", "function add(a, b)", "")),
        ("java", "class A {\n  int say(int x) {\n    return x;\n  }\n}\n", ("say", "  int say(int x)", "")),
        ("csharp", "class A {\n  int Say(int x) {\n    return x;\n  }\n}\n", ("Say", "  int Say(int x)", "")),
        ("ruby", "class A\n  def say(x)\n    x\n  end\nend\n", ("say", "  def say(x)", "")),
        ("lua", "local function add(a, b)\n  return a + b\nend\n", ("add", "local function add(a, b)", "")),
        ("cpp", "int twice(int x) {\n  return 2 * x;\n}\n", ("twice", "int twice(int x)", "")),
    ],
)
def test_each_grammar_gives_its_definitions_header_and_comment(
    language: str, source: str, expected: tuple[str, str, str]
) -> None:
    name, signature, doc = expected
    found = [d for d in definitions_of(source, language, "f") if d.name == name]
    assert found, [d.name for d in definitions_of(source, language, "f")]
    assert (found[0].signature, found[0].doc) == (signature, doc)
    assert found[0].doc_above == bool(doc)


def test_a_language_without_a_grammar_has_no_definitions() -> None:
    assert definitions_of("def f(): pass\n", "plaintext", "f.txt") == []
    assert grammars.language_of_path("notes.txt") is None and grammars.language_of_path("a/B.TSX") == "typescriptreact"


def test_the_index_reads_source_files_and_skips_ignored_vendored_binary_generated_and_linked(tmp_path: Path) -> None:
    write(
        tmp_path,
        {
            "app/main.py": "def main(): pass\n",
            "app/secret.py": "def hidden(): pass\n",
            "app/.gitignore": "secret.py\n",
            ".gitignore": "scratch/\n*.gen.py\n",
            "scratch/tmp.py": "def tmp(): pass\n",
            "lib/x.gen.py": "def generated_by_name(): pass\n",
            "node_modules/dep/index.js": "function dep() {}\n",
            ".venv/lib/site.py": "def site(): pass\n",
            "proto/msg_pb2.py": "def message(): pass\n",
            "lib/marked.go": "// Code generated by protoc. DO NOT EDIT.\npackage lib\nfunc Marked() {}\n",
            "lib/util.go": "package lib\n\nfunc Util() {}\n",
            "README.md": "# not code\n",
        },
    )
    (tmp_path / "lib" / "blob.c").write_bytes(b"int f(void);\0\x01\x02")
    (tmp_path / "lib" / "linked.py").symlink_to(tmp_path / "app" / "main.py")
    privacy = Privacy([tmp_path])
    listed = sorted(path.relative_to(tmp_path).as_posix() for path in workspace_files(tmp_path, 100, privacy))
    assert listed == ["app/main.py", "lib/blob.c", "lib/marked.go", "lib/util.go"]
    index = WorkspaceIndex()
    report = index.build([tmp_path])
    assert report.files == 2  # the binary and the generated file are read and refused
    assert [d.name for d in index.definitions_named("Util")] == ["Util"]
    assert index.definitions_named("Marked") == [] and index.definitions_named("hidden") == []
    assert list(workspace_files(tmp_path, 1, privacy)) == [tmp_path / "app" / "main.py"]  # the file limit
    assert (
        list(workspace_files(tmp_path, 100, privacy, max_visited=3)) == []
    )  # the walk's limit: the root alone has more


@pytest.mark.parametrize(
    ("head", "generated"),
    [
        ("// Code generated by protoc-gen-go. DO NOT EDIT.\n", True),
        ("# -*- coding: utf-8 -*-\n# Generated by Django 4.2 on 2024-01-01 12:00\n", True),
        ("/* @generated SignedSource<<abc>> */\n", True),
        ("# This file was automatically generated by SWIG.\n", True),
        ("// Autogenerated from schema.json\n", True),
        ('"""AST nodes generated by the parser for the compiler. Also provides\n', False),  # jinja2 3.1.4 nodes.py
        ("// Tokens generated by the lexer are kept here.\n", False),
        ("# Helpers for ids generated from a seed.\n", False),
    ],
)
def test_a_generated_file_is_told_by_its_tools_mark_not_by_a_docstring_that_says_generated(
    tmp_path: Path, head: str, generated: bool
) -> None:
    path = tmp_path / "module.py"
    path.write_text(head + "def name():\n    pass\n")
    assert (read_source(path) is None) is generated


def test_an_index_forgets_a_file_and_its_names(tmp_path: Path) -> None:
    index = WorkspaceIndex()
    path = str(tmp_path / "a.py")
    index.index_text(path, "def one(): pass\ndef two(): pass\n")
    version = index.version
    index.index_text(path, "def two(): pass\n")
    assert index.definitions_named("one") == [] and len(index.definitions_named("two")) == 1
    assert index.version > version
    index.remove(path)
    assert index.definitions_named("two") == [] and path not in index
    assert index.report().definitions == 0 and index.report().windows == 0


def test_an_open_document_too_big_to_be_code_is_not_indexed(tmp_path: Path) -> None:
    """As the walk skips files over MAX_FILE_BYTES, so the index skips an open document's text past it; the
    version indexed before it grew goes."""
    index = WorkspaceIndex()
    path = str(tmp_path / "data.py")
    index.index_text(path, "def small(): pass\n")
    index.index_text(path, "def small(): pass\n" + "x = 1\n" * (MAX_FILE_BYTES // 6))
    assert path not in index and index.definitions_named("small") == []


def test_imports_resolve_to_python_modules_and_relative_javascript_files(tmp_path: Path) -> None:
    write(
        tmp_path,
        {
            "src/shapes/__init__.py": "",
            "src/shapes/geometry.py": GEOMETRY,
            "src/shapes/colour.py": "RED = 1\n",
            "web/util.ts": "export function pad(s: string): string { return s; }\n",
        },
    )
    exists = lambda path: Path(path).is_file()  # noqa: E731
    main = str(tmp_path / "src" / "shapes" / "draw.py")
    python = "from .geometry import (area,\n    Rectangle as R)\nimport shapes.colour\n"
    python += "from shapes import colour\nimport os\n"
    found = imports_of(python, "python", main, [str(tmp_path)], exists)
    geometry, colour = str(tmp_path / "src/shapes/geometry.py"), str(tmp_path / "src/shapes/colour.py")
    assert [(entry.path, entry.names) for entry in found] == [
        (geometry, ("area", "Rectangle")),
        (str(tmp_path / "src/shapes/__init__.py"), ("colour",)),
        (colour, ()),
        (colour, ()),
    ]
    script = "import { pad } from './util.js';\nconst { other } = require('../missing');\n"
    found = imports_of(script, "typescript", str(tmp_path / "web" / "main.ts"), [], exists)
    assert [(entry.path, entry.names) for entry in found] == [(str(tmp_path / "web/util.ts"), ("pad",))]


def _context(tmp_path: Path, files: dict[str, str]) -> RepoContext:
    write(tmp_path, files)
    index = WorkspaceIndex()
    index.build([tmp_path])
    return RepoContext(index)


def test_the_chunks_hold_the_definitions_of_the_names_used_and_imported_in_path_order(tmp_path: Path) -> None:
    repo = _context(tmp_path, {"shapes/__init__.py": "", "shapes/geometry.py": GEOMETRY, "app/main.py": MAIN})
    main = str(tmp_path / "app" / "main.py")
    chunks = repo.chunks(main, MAIN, MAIN.splitlines(True), "python", 6, 2048)
    assert [(chunk.origin, chunk.path) for chunk in chunks] == [(DEFINITION, "shapes/geometry.py")]
    text = chunks[0].text
    assert 'def area(width: float,\n         height: float) -> float:\n    """Width times height."""\n' in text
    assert "class Rectangle:\n" in text and '    def scaled(self, factor: float) -> "Rectangle":\n' in text
    assert "inner" not in text  # nested in a function: no other file reaches it
    assert text.index("class Rectangle") < text.index("def area")  # the file's own order
    assert (
        repo.chunks(main, MAIN, MAIN.splitlines(True), "python", 6, 2048) == chunks
    )  # the same cursor: the same chunks
    small = repo.chunks(main, MAIN, MAIN.splitlines(True), "python", 6, 200)
    assert sum(len(chunk.text) for chunk in small) <= 200 and "def area" in small[0].text  # the nearest name first


def test_a_name_defined_in_many_files_counts_only_where_the_file_imports_it(tmp_path: Path) -> None:
    files = {f"m{i}.py": f"def run():\n    return {i}\n" for i in range(5)}
    files["local.py"] = "def run():\n    pass\n"
    repo = _context(tmp_path, files)

    def definitions(path: str, text: str, line: int) -> list[tuple[str, str]]:
        chunks = repo.chunks(str(tmp_path / path), text, text.splitlines(True), "python", line, 2048)
        return [(chunk.path, chunk.text) for chunk in chunks if chunk.origin == DEFINITION]

    assert definitions("caller.py", "def go():\n    run()\n", 1) == []  # defined in six files: which one?
    assert definitions("caller.py", "from m3 import run\n\n\ndef go():\n    run()\n", 4) == [("m3.py", "def run():\n")]
    assert definitions("local.py", "def run():\n    run()\n", 1) == []  # its own


def test_code_like_the_lines_before_the_cursor_comes_as_a_snippet(tmp_path: Path) -> None:
    loader = "".join(f"    value_{i} = parse_field(record, 'field_{i}')\n" for i in range(12))
    repo = _context(
        tmp_path,
        {"loaders/csv_loader.py": f"def load_csv(record):\n{loader}    return build_row(value_0, value_1)\n"},
    )
    writing = "def load_json(record):\n" + loader[: loader.index("value_8")]
    chunks = repo.chunks(str(tmp_path / "json_loader.py"), writing, writing.splitlines(True), "python", 9, 4096)
    snippets = [chunk for chunk in chunks if chunk.origin == SNIPPET]
    assert [chunk.path for chunk in snippets] == ["loaders/csv_loader.py"]
    assert "parse_field(record, 'field_3')" in snippets[0].text


def test_identifiers_near_the_cursor_come_nearest_line_first() -> None:
    lines = ["far_away = 1", "above = 2", "here = above", "below = 3"]
    assert identifiers_near(lines, 2) == ["above", "below", "far_away"]  # not the cursor's own line
    assert assembly.LINES_BEFORE >= 2


def test_the_context_command_prints_an_imported_functions_definition_from_another_file(tmp_path: Path) -> None:
    write(tmp_path, {"shapes/__init__.py": "", "shapes/geometry.py": GEOMETRY, "app/main.py": MAIN})
    (tmp_path / ".git").mkdir()
    command = [sys.executable, "-m", "diffgemma_lsp", "context", f"{tmp_path / 'app' / 'main.py'}:7:24", "--json"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, cwd=tmp_path / "app")
    assert done.returncode == 0, done.stderr
    shown = json.loads(done.stdout)
    assert shown["prefix"].endswith("        result += area(") and shown["suffix"] == "\n"
    chunk = next(chunk for chunk in shown["chunks"] if chunk["path"] == "shapes/geometry.py")
    assert chunk["origin"] == "definition" and "def area(width: float," in chunk["text"]
    plain = subprocess.run(command[:-1], capture_output=True, text=True, timeout=60)
    assert "=== definition: shapes/geometry.py ===" in plain.stdout and "=== prefix ===" in plain.stdout
    bad = subprocess.run([*command[:4], f"{tmp_path}/app/main.py:0:1"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "count from 1" in bad.stderr


def test_the_grammars_load_and_parse_with_the_network_unreachable() -> None:
    """No grammar is downloaded at run time: every language parses, for the index and for post-processing, in a
    process where opening a socket fails."""
    script = textwrap.dedent(
        """
        import socket
        def refuse(*args, **kwargs):
            raise OSError("network unreachable (test)")
        socket.socket.connect = refuse
        socket.create_connection = refuse
        from diffgemma_lsp import grammars
        from diffgemma_lsp.repo.definitions import definitions_of
        from diffgemma_lsp.postprocess import postprocess
        for language in grammars.GRAMMARS:
            assert grammars.definitions_query(language) is not None, language
            definitions_of("x = 1\\n", language, "f")
            edit = postprocess("f(x) {\\n  ", "\\n}\\n", "g(x)\\n}", language)
            assert edit is not None and edit.text.startswith("g(x)"), (language, edit)
        print(len(grammars.GRAMMARS))
        """
    )
    environment = {**os.environ, "HTTP_PROXY": "http://127.0.0.1:9", "HTTPS_PROXY": "http://127.0.0.1:9"}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, env=environment)
    assert done.returncode == 0, done.stderr
    assert int(done.stdout) == len(grammars.GRAMMARS)


async def test_the_live_index_follows_an_open_documents_text_and_forgets_it_on_close(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(live, "REINDEX_DELAY_S", 0.05)
    write(tmp_path, {"ws/a.py": "def on_disk(): pass\n", "elsewhere/b.py": "def outside(): pass\n"})
    index = live.LiveIndex()
    index.start([tmp_path / "ws", tmp_path / "missing"])
    assert index.built is not None
    await index.built
    assert index.status() == {"files": 1, "definitions": 1, "windows": 1, "building": False, "indexed": 1, "found": 1}
    inside, outside = (tmp_path / "ws" / "a.py").as_uri(), (tmp_path / "elsewhere" / "b.py").as_uri()
    texts = {inside: "def typed(): pass\n"}
    for _ in range(3):  # a burst of keystrokes: parsed once, after it
        index.document_changed(inside, lambda: texts[inside], "python")
    await asyncio.sleep(0.3)
    assert [d.name for d in index.index.definitions_in(str(tmp_path / "ws" / "a.py"))] == ["typed"]
    index.document_opened(outside, "def outside(): pass\n", "python")
    await asyncio.sleep(0.3)
    assert index.index.definitions_named("outside") == []  # outside the workspace: never in a prompt (issue 42)
    index.document_closed(outside)
    index.document_closed(inside)  # in it: the disk's text again
    await asyncio.sleep(0.3)
    assert index.index.definitions_named("outside") == []
    assert [d.name for d in index.index.definitions_in(str(tmp_path / "ws" / "a.py"))] == ["on_disk"]
    index.document_opened("untitled:Untitled-1", "def nothing(): pass\n", "python")
    assert live.path_of("untitled:Untitled-1") is None


async def test_a_build_that_fails_reaches_whoever_awaits_it() -> None:
    assert await live._on_daemon_thread(lambda: 6 * 7) == 42
    with pytest.raises(ZeroDivisionError):
        await live._on_daemon_thread(lambda: 1 // 0)


def test_removed_windows_are_never_found_and_their_ids_are_dropped_in_time() -> None:
    index = SnippetIndex(max_windows=50)
    lines = [f"alpha_{i} = beta_{i} + gamma + delta + epsilon + zeta" for i in range(16)]
    query = tokens_of(lines)
    for round_ in range(6):  # one file indexed anew six times: its old windows die each time
        assert index.replace("a.py", windows_of(lines)) == 1
        index.replace(f"b{round_}.py", windows_of(lines))
        index.remove(f"b{round_}.py")
    assert [snippet.path for snippet in index.similar(query, "other.py", 5)] == ["a.py"]
    assert index.similar(query, "a.py", 5) == []  # the file asked for is left out
    index._compact()
    assert sum(len(postings) for postings in index._postings.values()) == len(query)  # one live window
    assert len(index) == 1
    full = SnippetIndex(max_windows=1)
    assert full.replace("a.py", windows_of(lines)) == 1 and full.replace("b.py", windows_of(lines)) == 0


def test_a_file_indexed_anew_many_times_is_still_found_before_compaction() -> None:
    """Each new parse of an edited file would leave dead ids under its identifiers (up to 1,000 before the
    compaction): they must not make those identifiers look common, or the file would never be similar to anything."""
    index = SnippetIndex()
    for number in range(400):
        index.replace(f"other{number}.py", windows_of([f"unrelated_{number} = {number}"]))
    lines = [f"alpha_{i} = beta_{i} + gamma + delta + epsilon + zeta" for i in range(16)]
    for _ in range(300):  # typing in a.py for 25 minutes: parsed again every 5 s
        index.replace("a.py", windows_of(lines))
    assert len(index._postings["gamma"]) == 1  # the edited file's dead ids went at once
    assert index._dead == 299  # the compaction has not run
    assert [snippet.path for snippet in index.similar(tokens_of(lines), "b.py", 5)] == ["a.py"]


async def test_documents_opened_and_closed_in_a_burst_leave_nothing_in_the_index(tmp_path: Path) -> None:
    """Issue 42, finding 7: an opened document's text was indexed on a worker thread after its close had looked for
    it in the index (not there yet): it stayed, reaching prompts, and memory grew with every such pair."""
    index = live.LiveIndex()
    index.start([tmp_path])
    assert index.built is not None
    await index.built
    for number in range(100):
        uri = (tmp_path / f"scratch{number}.py").as_uri()
        index.document_opened(uri, f"def scratch_{number}(): pass\n", "python")
        index.document_closed(uri)
    while index._tasks:
        await asyncio.gather(*index._tasks)
    assert index.status()["files"] == 0 and index.index.definitions_named("scratch_7") == []
