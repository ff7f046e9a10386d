"""A keystroke in a big document: pygls' ``TextDocument`` against the language server's ``LineDocument``.

    python -m benchmarks.big_document [--sizes-mb 1,5,50] [--keystrokes 200]

For documents of each size, made of stdlib Python files repeated, it types one character after another in the
middle of the document, as an editor sends them: one incremental ``didChange`` of one character each. It times,
per keystroke, the document applying the change, then ``build_context`` at the cursor (what each completion
request does first, with the default ``contextTokens``), on pygls' ``TextDocument`` and on ``LineDocument``.
pygls' document takes about its size per keystroke, so it types fewer keystrokes in the big ones
(``--pygls-keystrokes`` at the smallest size, fewer in proportion). Each document must then hold the text with
the typed characters in place.
Writes ``benchmarks/results/big_document.json`` and a plot beside it.
"""

from __future__ import annotations

import argparse
import statistics
import sysconfig
import time
from pathlib import Path

from lsprotocol import types
from pygls.workspace import TextDocument

from benchmarks.machine import machine_report
from benchmarks.plots import grouped_bars
from benchmarks.report import RESULTS, write_report
from diffgemma_lsp.context import build_context
from diffgemma_lsp.document import LineDocument
from diffgemma_lsp.settings import Settings

SOURCES = ["textwrap.py", "json/encoder.py", "argparse.py", "difflib.py", "shlex.py", "fractions.py"]
MB = 1_000_000


def python_like(size: int) -> str:
    """About ``size`` characters of Python: the stdlib files of ``SOURCES`` one after another, repeated."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    block = "".join((stdlib / name).read_text() for name in SOURCES)
    return (block * (size // len(block) + 1))[:size].rsplit("\n", 1)[0] + "\n"


def typing_line(text: str) -> tuple[int, int, int]:
    """A line in the middle of ``text`` with code on it, the column at its end (where the user types) and the
    offset of that end."""
    lines = text.split("\n")
    line = len(lines) // 2
    while len(lines[line].strip()) < 20 or not lines[line].isascii():
        line += 1
    return line, len(lines[line]), sum(len(before) + 1 for before in lines[: line + 1]) - 1


def type_into(
    kind: type[TextDocument], text: str, keystrokes: int, context_tokens: int
) -> tuple[list[float], list[float]]:
    """Type ``keystrokes`` characters at the typing line; per keystroke, the ms of the change and of the context.
    ``AssertionError`` unless the document then holds the text with those characters in place."""
    document = kind("file:///big.py", text, version=1)
    line, column, offset = typing_line(text)
    change_ms: list[float] = []
    context_ms: list[float] = []
    for count in range(keystrokes):
        at = types.Position(line=line, character=column + count)
        change = types.TextDocumentContentChangePartial(range=types.Range(start=at, end=at), text="x")
        started = time.perf_counter()
        document.apply_change(change)
        changed = time.perf_counter()
        build_context(document, types.Position(line=line, character=column + count + 1), context_tokens)
        done = time.perf_counter()
        change_ms.append((changed - started) * 1000)
        context_ms.append((done - changed) * 1000)
    assert document.source == text[:offset] + "x" * keystrokes + text[offset:], "the keystrokes went elsewhere"
    return change_ms, context_ms


def median(samples: list[float]) -> float:
    """The median, rounded for the report."""
    return round(statistics.median(samples), 4)


def measure(args: argparse.Namespace) -> dict[str, object]:
    """Every size, both documents; returns the figures."""
    sizes = [float(size) for size in args.sizes_mb.split(",")]
    context_tokens = Settings().context_tokens
    figures: dict[str, object] = {"context_tokens": context_tokens, "sizes": []}
    for size_mb in sizes:
        text = python_like(int(size_mb * MB))
        pygls_keystrokes = max(3, min(args.keystrokes, round(args.pygls_keystrokes * min(sizes) / size_mb)))
        row: dict[str, object] = {"size_mb": size_mb, "characters": len(text), "lines": text.count("\n")}
        for name, kind, keystrokes in (
            ("pygls", TextDocument, pygls_keystrokes),
            ("line", LineDocument, args.keystrokes),
        ):
            change_ms, context_ms = type_into(kind, text, keystrokes, context_tokens)
            row[name] = {
                "keystrokes": keystrokes,
                "change_median_ms": median(change_ms),
                "change_max_ms": round(max(change_ms), 4),
                "build_context_median_ms": median(context_ms),
                "keystroke_and_context_median_ms": median([a + b for a, b in zip(change_ms, context_ms, strict=True)]),
            }
            print(f"{size_mb:g} MB, {name}: {row[name]}", flush=True)
        figures["sizes"].append(row)  # type: ignore[union-attr]
    return figures


def main() -> None:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes-mb", default="1,5,50", help="document sizes in MB, comma-separated")
    parser.add_argument("--keystrokes", type=int, default=200, help="keystrokes typed into each LineDocument")
    parser.add_argument(
        "--pygls-keystrokes",
        type=int,
        default=250,
        help="keystrokes typed into pygls' document of the smallest size, at most --keystrokes (fewer in bigger "
        "ones, in proportion, at least 3)",
    )
    parser.add_argument("--out", type=Path, default=RESULTS / "big_document.json")
    args = parser.parse_args()
    machine = machine_report()  # before the benchmark loads the machine
    started = time.perf_counter()
    figures = measure(args)
    figures["seconds"] = round(time.perf_counter() - started, 1)
    rows = figures["sizes"]
    write_report(
        args.out,
        figures,
        machine,
        plot=lambda png: grouped_bars(
            png,
            "one keystroke in a big document (median ms, log scale)",
            [f"{row['size_mb']:g} MB" for row in rows],
            {
                "pygls TextDocument: change": [row["pygls"]["change_median_ms"] for row in rows],
                "LineDocument: change": [row["line"]["change_median_ms"] for row in rows],
                "pygls TextDocument: build_context": [row["pygls"]["build_context_median_ms"] for row in rows],
                "LineDocument: build_context": [row["line"]["build_context_median_ms"] for row in rows],
            },
            "ms",
            log=True,
        ),
    )


if __name__ == "__main__":
    main()
