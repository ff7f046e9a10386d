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

from .canvas.step_mode import STEP_MODES, StepMode  # light: the standard library
from .loading.plan import DEFAULT_PROMPT_TOKENS, PRECISIONS  # light: attrs and the standard library
from .service.idle import parse_idle_exit  # light: the standard library
from .service.jobs import DEFAULT_MAX_BATCH, DEFAULT_MAX_PENDING, JobQueue  # light, as the two below
from .service.runtime_choice import Runtime, RuntimeChoice, RuntimeRefused, ServeOptions, choose_runtime
from .shared import protocol, socket_paths
from .shared.logfile import setup_logging

COMPILE_CHOICES = ("on", "off")
"""The older ``serve --compile`` (``on``: ``--step compiled``), and the benchmarks' own ``--compile``."""
MODEL_HELP = "checkpoint folder, or hub id (owner/name) pulled into the hub cache (default: the shipped model)"
WORKER_EXIT_TIMEOUT_S = 10.0
"""How long a stopping engine waits for the model thread to finish the job it is running."""


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


def add_model_args(parser: argparse.ArgumentParser) -> None:
    """Options shared by ``serve`` and ``infill``."""
    parser.add_argument("--model", default=None, help=MODEL_HELP)
    parser.add_argument(
        "--device",
        default="auto",
        help="auto (CUDA, then MPS, then CPU), cpu, mps, cuda, cuda:N, cuda:0,1; add cpu or disk to offload",
    )
    parser.add_argument("--dtype", default="auto", help="auto (the checkpoint's own), float32, bfloat16 or float16")
    parser.add_argument(
        "--max-memory",
        default=None,
        help="memory to use per device when spreading the model, e.g. cuda:0=20GiB,cpu=48GiB (default: what is free)",
    )
    parser.add_argument(
        "--quantization",
        choices=protocol.QUANTIZATION_CHOICES,
        default=None,
        help="int8 (torchao, CPU or CUDA, not MPS; needs the quant extra) or fp8 (CUDA compute capability 8.9+, no "
        "offload, the kernels package and its cached kernel); default: the checkpoint's own (none for a bf16 one)",
    )
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")


async def serve(args: argparse.Namespace, runtime: RuntimeChoice) -> int:
    """Listen on the socket, load the model on the model thread (or start the vLLM that holds it), serve until
    stopped."""
    from .service.server import EngineServer
    from .service.socket_file import AlreadyRunningError
    from .service.worker import ModelWorker

    loop = asyncio.get_running_loop()
    queue = JobQueue(max_pending=args.max_pending)
    server = EngineServer(queue, idle_exit_s=args.idle_exit)
    try:
        await server.start(args.socket)
    except AlreadyRunningError as exc:
        logging.getLogger("diffgemma_engine").warning(
            "%s (`diffgemma-lsp doctor --engine-socket %s` says what it serves; stop it to start another here)",
            exc,
            args.socket,
        )
        return 0 if args.exist_ok else 3
    except OSError as exc:  # an unsafe or unusable socket directory (another user's, a symlink, read-only)
        logging.getLogger("diffgemma_engine").error("cannot listen on %s: %s", args.socket, exc)
        return 4
    worker = ModelWorker(
        queue,
        args.model,
        args.device,
        args.dtype,
        on_loaded=lambda loaded: loop.call_soon_threadsafe(server.model_loaded, loaded),
        on_failed=lambda error: loop.call_soon_threadsafe(server.model_failed, error),
        threads=args.threads,
        max_batch=args.max_batch,
        step_mode=StepMode(args.step),
        max_memory=args.max_memory,
        quantization=args.quantization,
        vllm=runtime.vllm,
    )
    server.runtime_state = worker.runtime_state
    server.runtime_notes = worker.runtime_notes
    logging.getLogger("diffgemma_engine").info("canvases run by %s", runtime.reason)
    worker.start()
    await server.serve_until_stopped()
    queue.close()
    # Let the model thread end its last job and return before the interpreter shuts down: a daemon thread still
    # inside torch while the process finalizes can abort it (SIGABRT) instead of a clean exit.
    await asyncio.to_thread(worker.join, WORKER_EXIT_TIMEOUT_S)
    await asyncio.to_thread(worker.stop_runtime)
    return 1 if server.load_error else 0


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


def runtime_of(args: argparse.Namespace, parser: argparse.ArgumentParser) -> RuntimeChoice:
    """What runs ``serve``'s canvases (``diffgemma_engine.service.runtime_choice``); its refusal is the parser's."""
    options = ServeOptions(
        runtime=Runtime(args.runtime),
        engine_socket=args.socket,
        device=args.device,
        dtype=args.dtype,
        quantization=args.quantization,
        max_memory=args.max_memory,
        step=args.step,
        vllm_command=args.vllm_command,
        vllm_socket=args.vllm_socket,
        vllm_url=args.vllm_url,
        vllm_plain_http=args.vllm_plain_http,
        vllm_model=args.vllm_model,
        api_key=os.environ.get("DIFFGEMMA_VLLM_API_KEY", ""),
    )
    try:
        return choose_runtime(options)
    except RuntimeRefused as exc:
        parser.error(str(exc))


def default_step() -> str:
    """``serve --step``'s default: ``$DIFFGEMMA_STEP``; else compiled for the older ``$DIFFGEMMA_COMPILE=on``."""
    if step := os.environ.get("DIFFGEMMA_STEP"):
        return step
    return StepMode.COMPILED.value if os.environ.get("DIFFGEMMA_COMPILE") == "on" else StepMode.AUTO.value


def step_mode_of(args: argparse.Namespace, parser: argparse.ArgumentParser) -> str:
    """The one ``--step`` of ``serve``, from it, ``$DIFFGEMMA_STEP`` or the two flags it replaced (which agree with it
    or are refused)."""
    if args.step not in STEP_MODES:  # argparse does not check a default read from the environment
        parser.error(f"--step (or $DIFFGEMMA_STEP) must be one of {', '.join(STEP_MODES)}, not {args.step!r}")
    implied = {"on": StepMode.COMPILED.value}.get(args.compile) or {"captured": StepMode.CAPTURED.value}.get(args.loop)
    if args.compile == "on" and args.loop == "captured":
        parser.error("--compile on and --loop captured are two steps: use --step compiled or --step captured")
    if implied is None:
        return str(args.step)
    if args.step not in (implied, StepMode.EAGER.value, StepMode.AUTO.value):
        parser.error(f"--step {args.step} and the older flag meaning --step {implied} disagree: use --step alone")
    return implied


def add_serve_command(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``serve``: the resident engine on a Unix socket."""
    serve_parser = commands.add_parser("serve", help="serve infill requests on a Unix socket")
    add_model_args(serve_parser)
    serve_parser.add_argument("--socket", type=Path, default=None, help="default: the per-user runtime path")
    serve_parser.add_argument(
        "--max-pending", type=int, default=DEFAULT_MAX_PENDING, help="queued requests before 'busy'"
    )
    serve_parser.add_argument(
        "--max-batch",
        type=int,
        default=DEFAULT_MAX_BATCH,
        help="queued requests denoised together in one decoder pass (1: off)",
    )
    serve_parser.add_argument(
        "--step",
        default=default_step(),
        help="how the denoising step runs: auto (captured on a CUDA device, eager elsewhere); eager (op by op, "
        "every shape); compiled (torch.compile of the decoder "
        "pass and scores, dynamic shapes, compiled in the background and served eagerly until then); captured (the "
        "whole step compiled as one graph per serving shape, a CUDA graph on a GPU, warmed in the background; the "
        "eager loop serves until then, and serves batches, candidates and rewrites with held text); "
        "default: $DIFFGEMMA_STEP, compiled with the older $DIFFGEMMA_COMPILE=on, else auto",
    )
    # The two flags --step replaced, kept for scripts that pass them: --compile on is --step compiled, --loop
    # captured is --step captured.
    serve_parser.add_argument("--compile", choices=COMPILE_CHOICES, default=None, help=argparse.SUPPRESS)
    serve_parser.add_argument("--loop", choices=("eager", "captured"), default=None, help=argparse.SUPPRESS)
    serve_parser.add_argument(
        "--idle-exit",
        type=parse_idle_exit,
        default=0.0,
        help="exit after this many seconds without clients (0: never), or auto: 15 minutes for a model that loads "
        "in 10 s or less, 8 hours for a slower one (default: never)",
    )
    serve_parser.add_argument(
        "--exist-ok", action="store_true", help="exit 0 (not 3) when another engine already serves the socket"
    )
    serve_parser.add_argument(
        "--runtime",
        choices=[runtime.value for runtime in Runtime],
        default=os.environ.get("DIFFGEMMA_RUNTIME", Runtime.AUTO.value),
        help="what runs the canvases: this process's own loop (transformers); vLLM (vllm: one the engine starts "
        "with --vllm-command or the vllm on PATH, or one already listening at --vllm-socket or --vllm-url, the "
        "key from $DIFFGEMMA_VLLM_API_KEY); auto: vLLM where there is a CUDA device and a vllm to run, else the "
        "own loop (default: $DIFFGEMMA_RUNTIME, else auto)",
    )
    serve_parser.add_argument(
        "--vllm-command", default="", help="the vllm executable of a vLLM installation (default: vllm on PATH)"
    )
    serve_parser.add_argument("--vllm-socket", type=Path, default=None, help="the Unix socket of `vllm serve --uds`")
    serve_parser.add_argument("--vllm-url", default="", help="the URL of a vLLM server, e.g. http://127.0.0.1:8000")
    serve_parser.add_argument(
        "--vllm-plain-http",
        action="store_true",
        help="allow an http:// --vllm-url on another machine (your code and the key unencrypted on the network)",
    )
    serve_parser.add_argument("--vllm-model", default="", help="the served model's name (default: the one it serves)")


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
    for add_command in (add_serve_command, add_infill_command, add_plan_command, add_pull_command):
        add_command(commands)
    return parser


def main(argv: list[str] | None = None) -> None:
    """Command-line entry point."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "serve":
        args.step = step_mode_of(args, parser)
        if args.socket is None:
            args.socket = socket_paths.default_socket_path()
        if args.runtime not in [runtime.value for runtime in Runtime]:  # a default read from the environment
            parser.error(f"$DIFFGEMMA_RUNTIME must be one of transformers, vllm, auto, not {args.runtime!r}")
        runtime = runtime_of(args, parser)
    try:
        setup_logging(args.log_level, args.log_file, quiet=QUIET_LOGGERS)
    except OSError as exc:  # one line the language server can show, not a traceback
        parser.exit(2, f"diffgemma-engine: cannot write the log file {args.log_file}: {exc.strerror or exc}\n")
    if args.command == "serve":
        sys.exit(asyncio.run(serve(args, runtime)))
    if args.command == "plan":
        sys.exit(plan(args))
    if args.command == "pull":
        sys.exit(pull(args))
    sys.exit(infill(args))


if __name__ == "__main__":
    main()
