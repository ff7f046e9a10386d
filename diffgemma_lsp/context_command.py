"""``diffgemma-lsp context FILE:LINE:COL [--workspace DIR] [--private PATTERN]... [--json]``: what the model would be
sent for a completion there (1-based line and column, the column in characters): the prefix, the suffix and every
extra chunk with its origin and path, assembled by the language server's own code with the default settings and
the ``privateFiles`` patterns given (the editor's setting is not known outside it). Run outside an editor
there are no recently opened files or recent edits: the chunks are the workspace index's."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from urllib.parse import unquote

import attrs
from lsprotocol import types

from diffgemma_lsp.context import build_context
from diffgemma_lsp.document import LineDocument
from diffgemma_lsp.grammars import language_of_path
from diffgemma_lsp.session import Session
from diffgemma_lsp.settings import Settings


def _location(text: str) -> tuple[Path, int, int]:
    file, line, column = text.rsplit(":", 2)
    if int(line) < 1 or int(column) < 1:
        raise ValueError("the line and the column count from 1")
    return Path(file), int(line), int(column)


def _workspace_of(file: Path) -> Path:
    """The repository the file is in (the nearest folder above it with ``.git``), else its folder."""
    for folder in file.parents:
        if (folder / ".git").exists():
            return folder
    return file.parent


def build_parser() -> argparse.ArgumentParser:
    """The command line of ``diffgemma-lsp context``."""
    parser = argparse.ArgumentParser(prog="diffgemma-lsp context", description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("location", metavar="FILE:LINE:COL", help="the position, line and column counted from 1")
    parser.add_argument("--workspace", type=Path, default=None, help="the workspace folder (default: the repository)")
    parser.add_argument(
        "--private",
        action="append",
        default=[],
        metavar="PATTERN",
        help="a pattern of your privateFiles setting (gitignore syntax; repeat for each): files it names are left out",
    )
    parser.add_argument(
        "--json",
        action="store_true",
        help='{"prefix", "suffix", "chunks": [{origin, path, text}], "refused", "leftOut": [{path, reason}]}',
    )
    return parser


def main(argv: list[str]) -> int:
    """Print what the model would be sent at the position."""
    args = build_parser().parse_args(argv)
    try:
        file, line, column = _location(args.location)
        file = file.resolve()
        text = file.read_text(encoding="utf-8")
    except (ValueError, OSError, UnicodeDecodeError) as exc:
        print(f"diffgemma-lsp context: {args.location}: {exc}", file=sys.stderr)
        return 2
    workspace = (args.workspace or _workspace_of(file)).resolve()
    uri = file.as_uri()
    document = LineDocument(uri, text, version=1, language_id=language_of_path(file) or "")
    session = Session(lambda asked: document if asked == unquote(uri) else None)  # looked up unquoted
    settings = Settings(private_files=tuple(args.private))
    session.repo.index.set_private_patterns(settings.private_files)  # as the server does with the editor's setting
    session.repo.index.build([workspace])
    lines = text.splitlines()
    if line > max(len(lines), 1):
        print(f"diffgemma-lsp context: {file} has {len(lines)} lines", file=sys.stderr)
        return 2
    before = lines[line - 1][: column - 1] if lines else ""
    position = types.Position(line=line - 1, character=len(before.encode("utf-16-le")) // 2)
    context = build_context(document, position, settings.context_tokens)
    refused = session.refusal(uri, context.prefix, context.suffix)
    chunks = session.context_chunks(settings, uri, position.line, position.character) if refused is None else []
    index = session.repo.index
    left_out = [{"path": index.relative(entry.path), "reason": entry.reason} for entry in index.left_out]
    if args.json:
        chunk_list = [attrs.asdict(chunk) for chunk in chunks]
        sent = {"prefix": context.prefix, "suffix": context.suffix} if refused is None else {}
        print(json.dumps({**sent, "chunks": chunk_list, "refused": refused, "leftOut": left_out}))
        return 0
    if left_out:
        print("=== left out of the workspace index ===")
        print("".join(f"{entry['path']}: {entry['reason']}\n" for entry in left_out), end="")
    if refused is not None:
        print(f"=== nothing is sent for {file}: {refused} ===")
        return 0
    for chunk in chunks:
        print(f"=== {chunk.origin}: {chunk.path} ===\n{chunk.text}")
    print(f"=== prefix ===\n{context.prefix}\n=== suffix ===\n{context.suffix}")
    return 0
