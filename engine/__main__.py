"""``diffgemma-engine``: the resident model process.

diffgemma-engine serve  [--model DIR|ID] [--socket PATH] [--device auto|cpu|cuda] [--dtype auto|...]
diffgemma-engine infill [--model DIR|ID] [--prefix FILE] [--suffix FILE] [--language ID] [--show-prompt]
                        [--start FILE [--strength S] [--instruction TEXT]]
                                                    (prefix from stdin by default; with --start, a rewrite of
                                                    the text in FILE between prefix and suffix)
diffgemma-engine plan   [--model DIR|ID] [--device D] [--quantization Q] [--max-memory SPEC] [--rows N] [--json]
                                                    (memory and placement from the config; loads no weights; for a
                                                    hub id, fetches its config.json alone)
diffgemma-engine pull   ID [--revision R]           (download what loading needs into huggingface_hub's cache)

Every option of every command: ``diffgemma-engine COMMAND --help`` and the README's "Command line".
DIR is a checkpoint folder; ID a hub id (owner/name) in huggingface_hub's cache, loaded with no network.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from pathlib import Path

from .loading.plan import DEFAULT_PROMPT_TOKENS, PRECISIONS  # light: attrs and the standard library
from .serve_command import MODEL_HELP, add_model_args, add_serve_command, choice_for, options_of, serve
from .serve_command import default_step as default_step  # the command line's, read by tests
from .serve_command import runtime_of as runtime_of
from .serve_command import step_mode_of as step_mode_of
from .shared import protocol, socket_paths
from .shared.logfile import setup_logging

QUIET_LOGGERS = {"transformers": logging.WARNING, "httpx": logging.WARNING, "urllib3": logging.WARNING}
# torchao (imported by transformers when installed) tries its CUDA-only extensions and registers Enum constants on
# every start: expected with a CPU torch, and not the user's concern.
QUIET_LOGGERS |= {"torchao": logging.ERROR, "torch.utils._pytree": logging.ERROR}


def refuse(exc: BaseException) -> int:
    """Say on stderr why a command cannot do what was asked (``errors.describe``: no traceback, none of the engine's
    own paths), with the traceback in the log at debug level only; the exit status 2."""
    from .errors import describe

    logging.getLogger("diffgemma_engine").debug("refused", exc_info=exc)
    print(f"diffgemma-engine: {describe(exc)}", file=sys.stderr)
    return 2


def infill(args: argparse.Namespace) -> int:
    """Print one completion for a prefix and suffix, or with ``--start`` the replacement of a selection."""
    from .loading.model import load_model
    from .request.infill import build_prompt, run_infill

    try:
        prefix = args.prefix.read_text() if args.prefix else sys.stdin.read()
        suffix = args.suffix.read_text() if args.suffix else ""
        start = [protocol.StartSegment(text=args.start.read_text())] if args.start else []
        loaded = load_model(
            args.model, args.device, args.dtype, max_memory=args.max_memory, quantization=args.quantization
        )
        request = protocol.Infill(
            id="cli",
            uri="",
            prefix=prefix,
            suffix=suffix,
            canvas_length=args.canvas_length,
            max_steps=args.steps,
            seed=args.seed,
            language_id=args.language,
            start=start,
            strength=args.strength,
            instruction=args.instruction,
        )
        if args.show_prompt:
            prompt = build_prompt(loaded, request)
            code_tokens = prompt.prefix_tokens + prompt.suffix_tokens
            print(loaded.decode_prompt(prompt.ids), file=sys.stderr)
            print(
                f"-- prompt: {len(prompt.ids)} tokens ({loaded.layout.name.value} layout"
                f"{', cut to fit' if prompt.truncated else ''}); code: {prompt.code_chars} characters in "
                f"{code_tokens} tokens, {prompt.code_chars / max(code_tokens, 1):.2f} characters per token",
                file=sys.stderr,
            )
        text, stop, timings = run_infill(loaded, request)
    except Exception as exc:  # noqa: BLE001 - a boundary: a clear refusal, the traceback only in a debug log
        return refuse(exc)
    sys.stdout.write(text)
    if not text.endswith("\n"):
        sys.stdout.write("\n")
    logging.getLogger("diffgemma_engine").info(
        "stop=%s steps=%d new_tokens=%d encode=%.1fms denoise=%.1fms",
        stop.value,
        timings.steps,
        timings.new_tokens,
        timings.encode_ms,
        timings.denoise_ms,
    )
    return 0


def plan(args: argparse.Namespace) -> int:
    """Print how much memory the checkpoint needs and where it would go, from its config (no weights loaded)."""
    import json

    from .loading.loadable import environment
    from .loading.plan import (
        PlanError,
        detect_devices,
        format_plan,
        make_plan,
        parse_max_memory,
        plan_json,
        read_spec,
        select_devices,
    )

    try:
        folder = plan_folder(args.model)
        spec = read_spec(folder)
        devices = parse_max_memory(args.max_memory) if args.max_memory else detect_devices()
        result = make_plan(
            spec,
            select_devices(devices, args.device),
            precisions=(args.quantization,) if args.quantization else PRECISIONS,
            prompt_tokens=args.prompt_tokens,
            rows=args.rows,
            env=environment(),  # a setting the loader would refuse here is not given
        )
    except PlanError as exc:
        print(f"diffgemma-engine: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # noqa: BLE001 - a boundary: a clear refusal, the traceback only in a debug log
        return refuse(exc)
    print(json.dumps(plan_json(result), indent=2) if args.json else format_plan(result))
    return 0


def plan_folder(model: str | None) -> Path | None:
    """The folder to plan from: a hub id's snapshot (its ``config.json`` fetched alone when not cached; a note on
    stderr when its weights are not all there), else the folder as given."""
    from .loading import hub

    if model is None or not socket_paths.is_hub_id(model):
        return Path(model) if model is not None else None
    folder = hub.config_folder(model)
    if not (state := hub.snapshot_state(model, folder)).whole:
        print(f"diffgemma-engine: planned from {model}'s config.json; {state.summary()}", file=sys.stderr)
    return folder


def pull(args: argparse.Namespace) -> int:
    """Download what loading a hub id needs into huggingface_hub's cache; print the snapshot folder. With
    ``--check``, look in the cache alone and print how far a pull got."""
    from .errors import EngineError
    from .loading.hub import cache_state
    from .loading.hub import pull as pull_model

    if args.check:
        state = cache_state(args.id)
        print(state.summary())
        return 0 if state.whole else 1
    try:
        folder = pull_model(args.id, args.revision)
    except EngineError as exc:
        print(f"diffgemma-engine: {exc}", file=sys.stderr)
        return 2
    print(folder)
    if args.revision:
        print(f"diffgemma-engine: load this revision by its folder: --model {folder}", file=sys.stderr)
    return 0


def add_infill_command(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``infill``: one completion (or rewrite) printed."""
    infill_parser = commands.add_parser("infill", help="print one completion and exit")
    add_model_args(infill_parser)
    infill_parser.add_argument(
        "--prefix", type=Path, default=None, help="file with the text before the cursor (default: stdin)"
    )
    infill_parser.add_argument("--suffix", type=Path, default=None, help="file with the text after the cursor")
    infill_parser.add_argument("--canvas-length", type=int, default=0)
    infill_parser.add_argument("--steps", type=int, default=0)
    infill_parser.add_argument("--seed", type=int, default=0)
    infill_parser.add_argument("--language", default="", help="the document's language id (the chat layout's fences)")
    infill_parser.add_argument(
        "--show-prompt", action="store_true", help="print the prompt as the model sees it, and its size, on stderr"
    )
    infill_parser.add_argument(
        "--start",
        type=Path,
        default=None,
        help="file with the text to rewrite (the selection between prefix and suffix): print its replacement",
    )
    infill_parser.add_argument(
        "--strength",
        type=float,
        default=1.0,
        help="with --start: the share of the canvas renoised at the start, more than 0 and at most 1 (default 1)",
    )
    infill_parser.add_argument(
        "--instruction", default="", help="with --start, for an instruction model: what to do with the text"
    )


def add_plan_command(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``plan``: memory and placement from the config alone."""
    plan_parser = commands.add_parser("plan", help="memory needed and where it would go, from the config alone")
    plan_parser.add_argument("--model", default=None, help=MODEL_HELP + " (an id not cached: its config.json alone)")
    plan_parser.add_argument(
        "--device",
        default="auto",
        help="plan on these devices only: auto (all), cpu, cuda, cuda:0, cuda:0,1, cuda:0,cpu",
    )
    plan_parser.add_argument(
        "--quantization",
        choices=PRECISIONS,
        default=None,
        help="place this precision only (default: all of them, and recommend one)",
    )
    plan_parser.add_argument(
        "--max-memory",
        default=None,
        metavar="SPEC",
        help="describe the devices instead of measuring them, accelerate-style: cuda:0=24GiB,cpu=64GiB (or 0=24GiB)",
    )
    plan_parser.add_argument(
        "--prompt-tokens",
        type=int,
        default=DEFAULT_PROMPT_TOKENS,
        help=f"prompt length for the per-request cache (default {DEFAULT_PROMPT_TOKENS})",
    )
    plan_parser.add_argument("--rows", type=int, default=1, help="requests denoised together (serve --max-batch)")
    plan_parser.add_argument("--json", action="store_true", help="print one JSON object")


def add_pull_command(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``pull``: a hub id's checkpoint into the hub cache."""
    pull_parser = commands.add_parser("pull", help="download a hub id's checkpoint into the hub cache (resumable)")
    pull_parser.add_argument("id", help="the hub id, e.g. google/diffusiongemma-26B-A4B-it")
    pull_parser.add_argument("--revision", default=None, help="a branch, tag or commit (default: main)")
    pull_parser.add_argument(
        "--check",
        action="store_true",
        help="download nothing: print how much of it the hub cache holds (exit 0 when every weight file is whole)",
    )


def build_parser() -> argparse.ArgumentParser:
    """The engine's command line: serve, infill, plan, pull."""
    parser = argparse.ArgumentParser(prog="diffgemma-engine", description="The DiffusionGemma completion engine.")
    parser.add_argument("--log-level", default=os.environ.get("DIFFGEMMA_LOG_LEVEL", "info"))
    parser.add_argument("--log-file", type=Path, default=None)
    commands = parser.add_subparsers(dest="command", required=True)
    add_serve_command(commands)
    for add_command in (add_infill_command, add_plan_command, add_pull_command):
        add_command(commands)
    return parser


def main(argv: list[str] | None = None) -> None:
    """Command-line entry point."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "serve":
        options = options_of(args, parser)
        runtime = choice_for(options, parser)
    try:
        setup_logging(args.log_level, args.log_file, quiet=QUIET_LOGGERS)
    except OSError as exc:  # one line the language server can show, not a traceback
        parser.exit(2, f"diffgemma-engine: cannot write the log file {args.log_file}: {exc.strerror or exc}\n")
    if args.command == "serve":
        sys.exit(asyncio.run(serve(options, runtime)))
    if args.command == "plan":
        sys.exit(plan(args))
    if args.command == "pull":
        sys.exit(pull(args))
    sys.exit(infill(args))


if __name__ == "__main__":
    main()
