"""``diffgemma-engine serve``: its command line, read into the one ``ServeOptions``
(``diffgemma_engine.shared.serve_options``, which the language server's engine launcher writes), and the resident
engine it runs: the socket side (``service.server``), the model thread (``service.worker``) and the runtime that
runs the canvases (``runtimes``)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING

import attrs

from .service.idle import parse_idle_exit  # light: the standard library
from .service.jobs import JobQueue  # light, as the two below
from .service.runtime_choice import RuntimeChoice, RuntimeRefused, choose_runtime
from .shared import protocol, socket_paths
from .shared.serve_options import (
    DEFAULT_MAX_BATCH,
    DEFAULT_MAX_PENDING,
    RUNTIMES,
    STEP_MODES,
    Runtime,
    ServeOptions,
    StepMode,
)

if TYPE_CHECKING:  # the runtimes import torch: only ``serve`` loads them
    from .runtimes.seam import CanvasRuntime

WORKER_EXIT_TIMEOUT_S = 10.0
"""How long a stopping engine waits for the model thread to finish the job it is running."""
RETIRED_ENVIRONMENT = {"DIFFGEMMA_COMPILE": "DIFFGEMMA_STEP=compiled"}
"""Variables the engine no longer reads, and what says it now (refused rather than quietly ignored)."""

MODEL_HELP = "checkpoint folder, or hub id (owner/name) pulled into the hub cache (default: the shipped model)"

logger = logging.getLogger("diffgemma_engine")


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


def canvas_runtime(options: ServeOptions, choice: RuntimeChoice, queue: JobQueue) -> CanvasRuntime:
    """The runtime ``choice`` names, for ``options``' model."""
    if choice.vllm is not None:
        from .runtimes.vllm_server import VllmServed

        return VllmServed(choice.vllm, options.model, next_deadline=queue.next_deadline)
    from .runtimes.own_loop import OwnLoop

    return OwnLoop(
        options.model,
        options.device,
        options.dtype,
        max_memory=options.max_memory,
        quantization=options.quantization,
        max_batch=options.max_batch,
        step_mode=StepMode(options.step),
    )


async def serve(options: ServeOptions, choice: RuntimeChoice) -> int:
    """Listen on the socket, start the runtime on the model thread (it loads the model, or starts the vLLM that holds
    it), serve until stopped."""
    from .service.server import EngineServer
    from .service.socket_file import AlreadyRunningError
    from .service.worker import ModelWorker

    loop = asyncio.get_running_loop()
    queue = JobQueue(max_pending=options.max_pending)
    server = EngineServer(queue, idle_exit_s=options.idle_exit)
    try:
        await server.start(options.engine_socket)
    except AlreadyRunningError as exc:
        logger.warning(
            "%s (`diffgemma-lsp doctor --engine-socket %s` says what it serves; stop it to start another here)",
            exc,
            options.engine_socket,
        )
        return 0 if options.exist_ok else 3
    except OSError as exc:  # an unsafe or unusable socket directory (another user's, a symlink, read-only)
        logger.error("cannot listen on %s: %s", options.engine_socket, exc)
        return 4
    runtime = canvas_runtime(options, choice, queue)
    worker = ModelWorker(
        queue,
        runtime,
        on_loaded=lambda loaded: loop.call_soon_threadsafe(server.model_loaded, loaded),
        on_failed=lambda error: loop.call_soon_threadsafe(server.model_failed, error),
        threads=options.threads,
    )
    server.runtime_state = runtime.state
    server.runtime_notes = runtime.notes
    logger.info("canvases run by %s", choice.reason)
    worker.start()
    await server.serve_until_stopped()
    queue.close()
    # Let the model thread end its last job and return before the interpreter shuts down: a daemon thread still
    # inside torch while the process finalizes can abort it (SIGABRT) instead of a clean exit.
    await asyncio.to_thread(worker.join, WORKER_EXIT_TIMEOUT_S)
    await asyncio.to_thread(runtime.stop)
    return 1 if server.load_error else 0


def options_of(args: argparse.Namespace, parser: argparse.ArgumentParser) -> ServeOptions:
    """``serve``'s parsed command line as its options; a default read from the environment that is not one of the
    choices, or a retired variable, is the parser's error."""
    step = step_mode_of(args, parser)
    if args.runtime not in RUNTIMES:  # a default read from the environment
        parser.error(f"$DIFFGEMMA_RUNTIME must be one of {', '.join(RUNTIMES)}, not {args.runtime!r}")
    parsed = {name: getattr(args, name) for name in attrs.fields_dict(ServeOptions) if hasattr(args, name)}
    return ServeOptions(
        **parsed
        | {
            "engine_socket": args.socket or socket_paths.default_socket_path(),
            "step": step,
            "runtime": Runtime(args.runtime),
            "api_key": os.environ.get("DIFFGEMMA_VLLM_API_KEY", ""),
        }
    )


def runtime_of(args: argparse.Namespace, parser: argparse.ArgumentParser) -> RuntimeChoice:
    """What runs the canvases of ``serve`` with the parsed ``args``."""
    return choice_for(options_of(args, parser), parser)


def choice_for(options: ServeOptions, parser: argparse.ArgumentParser) -> RuntimeChoice:
    """What runs ``serve``'s canvases (``diffgemma_engine.service.runtime_choice``); its refusal is the parser's."""
    try:
        return choose_runtime(options)
    except RuntimeRefused as exc:
        parser.error(str(exc))


def default_step() -> str:
    """``serve --step``'s default: ``$DIFFGEMMA_STEP``, else auto."""
    return os.environ.get("DIFFGEMMA_STEP") or "auto"


def step_mode_of(args: argparse.Namespace, parser: argparse.ArgumentParser) -> str:
    """``serve --step``, checked: argparse does not check a default read from ``$DIFFGEMMA_STEP``; the retired
    ``$DIFFGEMMA_COMPILE`` is refused, not quietly ignored."""
    for name, instead in RETIRED_ENVIRONMENT.items():
        if name in os.environ:
            parser.error(f"${name} is retired: use ${instead} (or serve --step)")
    if args.step not in STEP_MODES:
        parser.error(f"--step (or $DIFFGEMMA_STEP) must be one of {', '.join(STEP_MODES)}, not {args.step!r}")
    return str(args.step)


def add_serve_command(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    """``serve``: the resident engine on a Unix socket."""
    serve_parser = commands.add_parser("serve", help="serve infill requests on a Unix socket")
    add_model_args(serve_parser)
    add = serve_parser.add_argument
    add("--socket", type=Path, default=None, help="default: the per-user runtime path")
    add("--max-pending", type=int, default=DEFAULT_MAX_PENDING, help="queued requests before 'busy'")
    add(
        "--max-batch",
        type=int,
        default=DEFAULT_MAX_BATCH,
        help="queued requests denoised together in one decoder pass (1: off)",
    )
    add(
        "--step",
        default=default_step(),
        help="how the denoising step runs: auto (captured on a CUDA device, eager elsewhere); eager (op by op, "
        "every shape); compiled (torch.compile of the decoder "
        "pass and scores, dynamic shapes, compiled in the background and served eagerly until then); captured (the "
        "whole step compiled as one graph per serving shape, a CUDA graph on a GPU, warmed in the background; the "
        "eager loop serves until then, and serves batches, candidates and rewrites with held text); "
        "default: $DIFFGEMMA_STEP, else auto",
    )
    add(
        "--idle-exit",
        type=parse_idle_exit,
        default=0.0,
        help="exit after this many seconds without clients (0: never), or auto: 15 minutes for a model that loads "
        "in 10 s or less, 8 hours for a slower one (default: never)",
    )
    add("--exist-ok", action="store_true", help="exit 0 (not 3) when another engine already serves the socket")
    add_runtime_args(serve_parser)
    return serve_parser


def add_runtime_args(serve_parser: argparse.ArgumentParser) -> None:
    """``serve``'s options that choose what runs the canvases."""
    add = serve_parser.add_argument
    add(
        "--runtime",
        choices=RUNTIMES,
        default=os.environ.get("DIFFGEMMA_RUNTIME", Runtime.AUTO.value),
        help="what runs the canvases: this process's own loop (transformers); vLLM (vllm: one the engine starts "
        "with --vllm-command or the vllm on PATH, or one already listening at --vllm-socket or --vllm-url, the "
        "key from $DIFFGEMMA_VLLM_API_KEY); auto: vLLM where there is a CUDA device and a vllm to run, else the "
        "own loop (default: $DIFFGEMMA_RUNTIME, else auto)",
    )
    add("--vllm-command", default="", help="the vllm executable of a vLLM installation (default: vllm on PATH)")
    add("--vllm-socket", type=Path, default=None, help="the Unix socket of `vllm serve --uds`")
    add("--vllm-url", default="", help="the URL of a vLLM server, e.g. http://127.0.0.1:8000")
    add(
        "--vllm-plain-http",
        action="store_true",
        help="allow an http:// --vllm-url on another machine (your code and the key unencrypted on the network)",
    )
    add("--vllm-model", default="", help="the served model's name (default: the one it serves)")
