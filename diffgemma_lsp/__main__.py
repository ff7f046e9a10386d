"""``diffgemma-lsp``: the language server, on stdio.

diffgemma-lsp [--stdio] [--engine-socket PATH] [--model DIR|ID] [--log-file FILE] [-v]
diffgemma-lsp doctor [--probe] [--json]      (what is running, and whether it answers)
diffgemma-lsp openai [--host H] [--port P]   (an OpenAI-compatible /v1/completions endpoint, for Zed)
diffgemma-lsp context FILE:LINE:COL [--workspace DIR] [--json]   (what the model would be sent there)
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from diffgemma_lsp import __version__


def main(argv: list[str] | None = None) -> None:
    """Command-line entry point."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["doctor"]:
        from diffgemma_lsp import doctor

        sys.exit(doctor.main(argv[1:]))
    if argv[:1] == ["context"]:
        from diffgemma_lsp import context_command

        sys.exit(context_command.main(argv[1:]))
    if argv[:1] == ["openai"]:
        from diffgemma_lsp.endpoint import server as endpoint

        sys.exit(endpoint.main(argv[1:]))
    parser = argparse.ArgumentParser(prog="diffgemma-lsp", description="DiffusionGemma code completion over LSP.")
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
    parser.add_argument("--log-file", type=Path, default=None)
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    args = parser.parse_args(argv)

    from diffgemma_lsp.log import setup_logging
    from diffgemma_lsp.server import server

    level = "debug" if args.verbose else os.environ.get("DIFFGEMMA_LOG_LEVEL", "info")
    setup_logging(server, level, args.log_file)
    if args.engine_socket is not None:
        server.engine_socket = args.engine_socket.expanduser()
    if args.model is not None:
        server.cli_model = args.model
        server.apply_settings(None)
    server.start_io()


if __name__ == "__main__":
    main()
