"""``diffgemma-lsp``: the language server, on stdio; and the commands in :data:`SUBCOMMANDS`.

diffgemma-lsp [--stdio] [--engine-socket PATH] [--model DIR|ID] [--log-file FILE] [-v]
diffgemma-lsp COMMAND ...   (``diffgemma-lsp --help`` lists each command with its whole synopsis)
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from pathlib import Path

from diffgemma_lsp import __version__

SUBCOMMANDS = {
    "doctor": ("diffgemma_lsp.doctor", "what is running, and whether it answers"),
    "context": ("diffgemma_lsp.context_command", "what the model would be sent at FILE:LINE:COL (counted from 1)"),
    "openai": ("diffgemma_lsp.endpoint.server", "an OpenAI-compatible /v1/completions endpoint (for Zed)"),
}
"""Each command: the module whose ``build_parser()`` reads its command line and whose ``main(argv)`` runs it, and
what it does. The dispatch and ``--help`` both read this table: a command cannot be added without its help."""


def build_parser(with_commands: bool = False) -> argparse.ArgumentParser:
    """The language server's command line; ``with_commands``: its help also gives every command's synopsis (which
    imports the commands' modules, so only when help is asked for)."""
    parser = argparse.ArgumentParser(
        prog="diffgemma-lsp",
        description="DiffusionGemma code completion over LSP: with no command, the language server on stdio "
        "(what an editor runs).",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=commands_help() if with_commands else None,
    )
    parser.add_argument("--stdio", action="store_true", help="talk LSP on stdin/stdout (the default)")
    parser.add_argument(
        "--engine-socket",
        type=Path,
        default=None,
        help="the engine to use; one is started there when none runs (default: per-user path)",
    )
    parser.add_argument(
        "--model", default=None, help="checkpoint folder or hub id (owner/name) for an engine this server starts"
    )
    parser.add_argument(
        "--log-file", type=Path, default=None, help="the log (default: $XDG_STATE_HOME/diffgemma/lsp.log)"
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    return parser


def command_parser(name: str) -> argparse.ArgumentParser:
    """The command line of the command ``name``."""
    parser: argparse.ArgumentParser = importlib.import_module(SUBCOMMANDS[name][0]).build_parser()
    return parser


def commands_help() -> str:
    """The commands, each with what it does and its whole synopsis (``diffgemma-lsp COMMAND --help`` for more)."""
    lines = ["commands (diffgemma-lsp COMMAND --help says more):"]
    for name, (_module, summary) in SUBCOMMANDS.items():
        usage = command_parser(name).format_usage().removeprefix("usage: ").rstrip()
        first, *rest = (line.strip() for line in usage.splitlines())
        lines += [f"  {name:8} {summary}", f"    {first}", *(f"      {line}" for line in rest), ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    """Command-line entry point."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] and argv[0] in SUBCOMMANDS:
        sys.exit(importlib.import_module(SUBCOMMANDS[argv[0]][0]).main(argv[1:]))
    args = build_parser(with_commands=bool({"-h", "--help"} & set(argv))).parse_args(argv)

    from diffgemma_lsp.log import setup_logging
    from diffgemma_lsp.server import server

    level = "debug" if args.verbose else os.environ.get("DIFFGEMMA_LOG_LEVEL", "info")
    setup_logging(server, level, args.log_file)
    if args.engine_socket is not None:
        server.link.engine_socket = args.engine_socket.expanduser()
    if args.model is not None:
        server.cli_model = args.model
        server.apply_settings(None)
    server.start_io()


if __name__ == "__main__":
    main()
