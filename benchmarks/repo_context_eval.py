"""Context from the workspace index: does the prompt hold the definition of a name the line being written uses?

    python -m benchmarks.repo_context_eval [--packages pygls cattrs aiohttp huggingface_hub accelerate]
                                           [--lines 200] [--seed 0] [--opened 8] [--json PATH] [--plot PATH]

The repositories are installed packages' sources (each copied into a folder of its own, the package folder inside
it, as a checkout holds it). A line counts when it uses a name defined at the top level of another file of the same
package (found by the index's own tree-sitter definitions) and not in its own file; up to ``--lines`` such lines per
package, chosen at random (seeded): a name token (not in a string or a comment, not after a dot) in a statement that
is not an import, a ``def``, a ``class`` or a decorator. The user is taken to be writing that
line and to have typed it up to the name: the document is the file with the line cut there, the cursor at the cut.

Identifier recall is the share of those lines where the assembled context holds the definition's header (its first
line) in a chunk of the file that defines it, at the default budgets (``Settings``):

- ``index``: what the language server sends: the ring buffer of recent files, then the index's chunks
  (``Session.context_chunks``, the code the server runs);
- ``ring``: the ring buffer alone at its budget (``extraContextTokens``), the context before the index;
- ``ring_same_budget``: the ring buffer alone given both budgets (``extraContextTokens`` + ``repoContextTokens``).

The ring buffer holds chunks of ``--opened`` files of the package the user is taken to have opened before (chosen at
random, seeded per line, the current file excluded), each 64 lines from its start as ``didOpen`` takes them.

Also measured: the index's build (files per second, definitions, windows, memory by tracemalloc in a second
build), and the cost of assembling the chunks on the language server's event loop for each keystroke while the line
is typed character by character (p50, p95, ms; the first keystroke of each line apart, when the caches are cold).
"""

from __future__ import annotations

import argparse
import importlib.util
import io
import keyword
import random
import shutil
import statistics
import sys
import tempfile
import time
import tokenize
import tracemalloc
from pathlib import Path

from benchmarks.cursor_cases import cases_of
from benchmarks.machine import machine_report
from benchmarks.repo_sources import BY_NAME, SOURCES, Source, SourceUnavailable, workspace
from benchmarks.report import RESULTS, write_report
from diffgemma_lsp.document import LineDocument
from diffgemma_lsp.grammars import language_of_path
from diffgemma_lsp.repo.assembly import CURSOR_DEFINITION, DEFINITION, RECENT_FILE
from diffgemma_lsp.repo.definitions import Definition
from diffgemma_lsp.repo.index import WorkspaceIndex
from diffgemma_lsp.session import Session
from diffgemma_lsp.settings import Settings

DEFAULT_PACKAGES = ("pygls", "cattrs", "aiohttp", "huggingface_hub", "accelerate")
SKIPPED_STATEMENTS = frozenset({"import", "from", "def", "class", "async", "@"})


def package_folder(name: str) -> Path:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit(f"{name} is not an installed package")
    return Path(next(iter(spec.submodule_search_locations)))


def checkout_of(name: str, into: Path) -> Path:
    """The package's sources copied as a checkout holds them: ``into/name/name/...``; the checkout's root."""
    root = into / name
    shutil.copytree(package_folder(name), root / name, ignore=shutil.ignore_patterns("__pycache__", "*.so", "*.pyc"))
    return root


def choose_lines(index: WorkspaceIndex, root: Path, count: int, seed: int) -> list[tuple[Path, int, int, Definition]]:
    """(file, line, column, the definition used) for up to ``count`` lines that use a top-level name of another
    file first at ``column``: a name token (not in a string or comment, not an attribute), in a statement that is
    not an import, ``def``, ``class`` or decorator."""
    found: list[tuple[Path, int, int, Definition]] = []
    for path in sorted(root.rglob("*.py")):
        own = {definition.name for definition in index.definitions_in(str(path))}
        source = path.read_text(encoding="utf-8", errors="replace")
        try:
            tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
        except (tokenize.TokenError, SyntaxError):
            continue
        statement_start: str | None = None
        previous = ""
        used_lines: set[int] = set()
        for token in tokens:
            if token.type == tokenize.NEWLINE:
                statement_start = None
            elif token.type in (tokenize.NAME, tokenize.OP) and statement_start is None:
                statement_start = token.string
            if token.type == tokenize.NAME and statement_start not in SKIPPED_STATEMENTS and previous != ".":
                line = token.start[0] - 1
                if line not in used_lines and token.string not in own and not keyword.iskeyword(token.string):
                    elsewhere = [
                        d for d in index.definitions_named(token.string) if d.path != str(path) and not d.parent
                    ]
                    if len(elsewhere) == 1:
                        found.append((path, line, token.start[1], elsewhere[0]))
                        used_lines.add(line)
            if token.type not in (tokenize.NL, tokenize.COMMENT, tokenize.INDENT, tokenize.DEDENT):
                previous = token.string
    random.Random(seed).shuffle(found)
    return found[:count]


def held(chunks: list, definition: Definition, relative: str, origins: set[str]) -> bool:
    header = definition.signature.split("\n", 1)[0].strip()
    name = Path(definition.path).name
    return any(chunk.origin in origins and chunk.path in (relative, name) and header in chunk.text for chunk in chunks)


def evaluate(name: str, work: Path, lines: int, seed: int, opened: int) -> dict[str, object]:
    root = checkout_of(name, work)
    index = WorkspaceIndex()
    started = time.perf_counter()
    report = index.build([root])
    build_s = time.perf_counter() - started
    tracemalloc.start()
    measured = WorkspaceIndex()
    measured.build([root])
    memory = tracemalloc.get_traced_memory()[0]  # what the index holds, while it is alive
    tracemalloc.stop()
    del measured
    sources = sorted(root.rglob("*.py"))
    chosen = choose_lines(index, root, lines, seed)
    settings = Settings()
    ring_only = Settings(repo_context_tokens=0)
    ring_same = Settings(
        repo_context_tokens=0, extra_context_tokens=settings.extra_context_tokens + settings.repo_context_tokens
    )
    hits = {"index": 0, "index_definitions_only": 0, "ring": 0, "ring_same_budget": 0}
    first_ms: list[float] = []
    keystroke_ms: list[float] = []
    for number, (path, line, column, definition) in enumerate(chosen):
        text = path.read_text(encoding="utf-8")
        all_lines = text.splitlines(keepends=True)
        cut = all_lines[line][:column]
        uri = path.as_uri()
        documents: dict[str, LineDocument] = {}
        session = Session(documents.get)
        session.repo.index = index
        session.repo.context.index = index
        others = [other for other in sources if other != path]
        for other in random.Random(seed * 1000 + number).sample(others, min(opened, len(others))):
            session.extra.add(other.as_uri(), other.read_text(encoding="utf-8", errors="replace"))
        for typed in range(len(cut) - len(cut.lstrip()), len(cut) + 1):  # the line typed, a character at a time
            document = LineDocument(
                uri, "".join([*all_lines[:line], cut[:typed], "\n", *all_lines[line + 1 :]]), 1, "python"
            )
            documents[uri] = document
            started = time.perf_counter()
            chunks = session.context_chunks(settings, uri, line)
            (keystroke_ms if typed > len(cut) - len(cut.lstrip()) else first_ms).append(
                (time.perf_counter() - started) * 1000
            )
        relative = Path(definition.path).relative_to(root).as_posix()
        hits["index"] += held(chunks, definition, relative, {DEFINITION, RECENT_FILE})
        hits["index_definitions_only"] += held(chunks, definition, relative, {DEFINITION})
        hits["ring"] += held(session.context_chunks(ring_only, uri, line), definition, relative, {RECENT_FILE})
        hits["ring_same_budget"] += held(
            session.context_chunks(ring_same, uri, line), definition, relative, {RECENT_FILE}
        )
    total = max(len(chosen), 1)
    return {
        "package": name,
        "files": report.files,
        "definitions": report.definitions,
        "windows": report.windows,
        "build_s": round(build_s, 3),
        "files_per_s": round(report.files / build_s, 1) if build_s else None,
        "index_memory_mb": round(memory / 2**20, 1),
        "lines": len(chosen),
        "recall": {key: round(value / total, 3) for key, value in hits.items()},
        "first_keystroke_ms_p50": round(statistics.median(first_ms), 3) if first_ms else None,
        "keystroke_ms_p50": round(statistics.median(keystroke_ms), 3) if keystroke_ms else None,
        "keystroke_ms_p95": round(statistics.quantiles(keystroke_ms, n=20)[-1], 3) if len(keystroke_ms) > 1 else None,
    }


def go_module_of(root: Path) -> str:
    """A Go checkout's module path: its ``go.mod``'s, else the import path a GOPATH-style tree (Debian's
    ``/usr/share/gocode/src``) puts it at; '' for other languages."""
    go_mod = root / "go.mod"
    if go_mod.is_file():
        for line in go_mod.read_text(encoding="utf-8", errors="replace").splitlines():
            if line.startswith("module "):
                return line.split()[1]
    return root.as_posix().split("/src/", 1)[1] if "/gocode/src/" in root.as_posix() else ""


def utf16_length(text: str) -> int:
    return len(text.encode("utf-16-le")) // 2


def source_checkout(source: Source, into: Path) -> tuple[Path, str]:
    """The fetched package copied into ``into`` as a folder of its own (the cache is in this repository, whose git
    ignores it: the index would read nothing there), and its Go module path ('' for other languages)."""
    cached = workspace(source)
    root = into / source.name
    shutil.copytree(cached, root)
    return root, go_module_of(cached)


def evaluate_cursor(source: Source, count: int, seed: int) -> dict[str, object]:
    """The cursor cases of one fetched package (up to ``count``, seeded): how often the context holds the
    definition of the name just typed, and what the context costs per keystroke while the line is typed."""
    with tempfile.TemporaryDirectory(prefix="dg-cursor-eval-") as work:
        return _evaluate_cursor(source, *source_checkout(source, Path(work)), count, seed)


def _evaluate_cursor(source: Source, root: Path, go_module: str, count: int, seed: int) -> dict[str, object]:
    index = WorkspaceIndex()
    report = index.build([root])
    found = cases_of(root, index, go_module)
    cases = [case for case in found if str(case.defined_in) in index]  # a file the walk skips has no definitions
    chosen = random.Random(seed).sample(cases, min(count, len(cases)))
    settings = Settings()
    held_any = held_at_cursor = 0
    first_ms: list[float] = []
    keystroke_ms: list[float] = []
    misses: list[str] = []
    for case in chosen:
        all_lines = case.path.read_text(encoding="utf-8", errors="replace").splitlines(keepends=True)
        cut = all_lines[case.line][: case.column]
        uri = case.path.as_uri()
        language = language_of_path(case.path) or ""
        documents: dict[str, LineDocument] = {}
        session = Session(documents.get)
        session.repo.index = index
        session.repo.context.index = index
        indent = len(cut) - len(cut.lstrip())
        for typed in range(indent, len(cut) + 1):  # the line typed, a character at a time
            text = "".join([*all_lines[: case.line], cut[:typed], "\n", *all_lines[case.line + 1 :]])
            documents[uri] = LineDocument(uri, text, 1, language)
            started = time.perf_counter()
            chunks = session.context_chunks(settings, uri, case.line, utf16_length(cut[:typed]))
            (keystroke_ms if typed > indent else first_ms).append((time.perf_counter() - started) * 1000)
        relative = index.relative(str(case.defined_in))
        holding = [chunk for chunk in chunks if chunk.path == relative and case.header in chunk.text]
        held_any += bool(holding)
        held_at_cursor += any(chunk.origin == CURSOR_DEFINITION for chunk in holding)
        if not holding and len(misses) < 10:
            misses.append(f"{case.path.relative_to(root)}:{case.line + 1}:{case.column + 1} {cut.strip()}")
    total = max(len(chosen), 1)
    return {
        "package": f"{source.name} {source.version}",
        "registry": source.registry,
        "files": report.files,
        "definitions": report.definitions,
        "cases_found": len(found),
        "cases_not_indexed": len(found) - len(cases),
        "cases": len(chosen),
        "held": round(held_any / total, 3),
        "held_at_cursor": round(held_at_cursor / total, 3),
        "first_keystroke_ms_p50": round(statistics.median(first_ms), 3) if first_ms else None,
        "keystroke_ms_p50": round(statistics.median(keystroke_ms), 3) if keystroke_ms else None,
        "keystroke_ms_p95": round(statistics.quantiles(keystroke_ms, n=20)[-1], 3) if len(keystroke_ms) > 1 else None,
        "misses": misses,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--packages", nargs="*", default=list(DEFAULT_PACKAGES))
    parser.add_argument("--lines", type=int, default=200, help="lines per package")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--opened", type=int, default=8, help="files in the ring buffer (opened before)")
    parser.add_argument(
        "--sources",
        nargs="*",
        default=[source.name for source in SOURCES],
        choices=[source.name for source in SOURCES],
        help="fetched packages for the cursor cases (benchmarks/repo_sources.py); none: skip them",
    )
    parser.add_argument("--cases", type=int, default=300, help="cursor cases per fetched package")
    parser.add_argument("--json", type=Path, default=RESULTS / "repo_context_eval.json")
    parser.add_argument("--plot", type=Path, default=None, help="default: the --json path with .png")
    args = parser.parse_args()
    machine = machine_report()
    with tempfile.TemporaryDirectory(prefix="dg-repo-eval-") as work:
        packages = [evaluate(name, Path(work), args.lines, args.seed, args.opened) for name in args.packages]
    cursor: list[dict[str, object]] = []
    for name in args.sources:
        try:
            cursor.append(evaluate_cursor(BY_NAME[name], args.cases, args.seed))
        except SourceUnavailable as exc:
            print(f"repo_context_eval: skipped {name}: {exc}", file=sys.stderr)
            cursor.append({"package": name, "unavailable": str(exc)})
    lines = sum(int(package["lines"]) for package in packages)  # type: ignore[call-overload]

    def pooled(key: str) -> float:
        return round(sum(package["recall"][key] * package["lines"] for package in packages) / max(lines, 1), 3)  # type: ignore[index,operator]

    settings = Settings()
    figures: dict[str, object] = {
        "budgets_tokens": {
            "extraContextTokens": settings.extra_context_tokens,
            "repoContextTokens": settings.repo_context_tokens,
        },
        "opened_files": args.opened,
        "seed": args.seed,
        "lines": lines,
        "recall": {key: pooled(key) for key in ("index", "index_definitions_only", "ring", "ring_same_budget")},
        "packages": packages,
        "cursor_cases": cursor,
    }

    def plot(path: Path) -> None:
        from benchmarks.plots import grouped_bars

        names = [str(package["package"]) for package in packages] + ["all"]
        series = {
            label: [100 * package["recall"][key] for package in packages] + [100 * figures["recall"][key]]  # type: ignore[index]
            for label, key in (
                ("ring buffer (default budget)", "ring"),
                ("ring buffer (both budgets)", "ring_same_budget"),
                ("ring + workspace index", "index"),
            )
        }
        grouped_bars(
            args.plot or path, "Definition of the name used in the prompt (identifier recall)", names, series, "%"
        )

    write_report(args.json, figures, machine, plot)


if __name__ == "__main__":
    main()
