"""What runs the canvases, from ``serve``'s options: the engine's own loop (``--runtime transformers``: CPU, Mac,
tests, small models) or vLLM (``--runtime vllm``: on NVIDIA cards, near the memory-bandwidth floor), either one
the engine starts (``--vllm-command``, else ``vllm`` on PATH) or one already listening (``--vllm-socket``,
``--vllm-url``). ``--runtime auto`` picks vLLM where there is a CUDA device and a ``vllm`` to run, and none of the
own loop's options was asked for.

The precision and placement options (``--dtype``, ``--quantization``, ``--max-memory``, ``--step``) are the own
loop's: vLLM serves the checkpoint's own precision (an FP8 or 4-bit checkpoint for less memory), so with
``--runtime vllm`` they are refused rather than ignored."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

import attrs

from ..errors import ModelLoadError
from ..loading.placement import parse_devices
from ..shared.serve_options import Runtime as Runtime  # the choices, declared with the options
from ..shared.serve_options import ServeOptions as ServeOptions
from ..shared.urls import plain_http_elsewhere, redacted
from ..vllm.client import VllmServer
from ..vllm.process import VllmRuntime


class RuntimeRefused(ValueError):
    """Options that cannot go together, said as the user can mend them."""


@attrs.frozen
class RuntimeChoice:
    """The runtime picked (``vllm`` None: the engine's own loop) and why, for the log."""

    vllm: VllmRuntime | None
    reason: str


def vllm_socket_beside(engine_socket: Path) -> Path:
    """Where a vLLM the engine runs listens: beside the engine's own socket, in its private directory
    (``engine.sock`` → ``engine.vllm.sock``)."""
    return engine_socket.with_name(f"{engine_socket.stem}.vllm.sock")


def find_vllm(command: str) -> Path | None:
    """The ``vllm`` executable: ``command`` (a path) when given, else ``vllm`` on PATH; None when there is none.
    ``RuntimeRefused`` when the given path is not an executable file."""
    if not command:
        found = shutil.which("vllm")
        return Path(found) if found else None
    path = Path(command).expanduser()
    if not path.is_file() or not os.access(path, os.X_OK):
        raise RuntimeRefused(f"--vllm-command {command}: not an executable file (the `vllm` of a vLLM installation)")
    return path.resolve()


def cuda_device_count() -> int:
    """CUDA devices torch sees (0 with a CPU-only torch)."""
    import torch

    return torch.cuda.device_count()


def choose_runtime(options: ServeOptions, cuda_count: Callable[[], int] | None = None) -> RuntimeChoice:
    """The runtime ``options`` ask for (``cuda_count``: the CUDA devices here, asked of torch only when needed);
    ``RuntimeRefused`` when they cannot go together."""
    cuda_count = cuda_count or cuda_device_count
    attach = options.vllm_socket is not None or bool(options.vllm_url)
    if options.vllm_socket is not None and options.vllm_url:
        raise RuntimeRefused("--vllm-socket and --vllm-url name two servers: give one")
    if options.runtime is Runtime.TRANSFORMERS:
        if attach or options.vllm_command:
            raise RuntimeRefused("--vllm-socket, --vllm-url and --vllm-command are for --runtime vllm (or auto)")
        return RuntimeChoice(None, "--runtime transformers")
    own = options.own_loop_options()
    executable = None  # looked up once: here for auto, below for --runtime vllm
    if options.runtime is Runtime.AUTO and not attach:
        executable = find_vllm(options.vllm_command)
        why_not = (
            f"{own[0]} asks for the engine's own loop"
            if own
            else "no `vllm` on PATH (--vllm-command names one)"
            if executable is None
            else f"--device {options.device} is not CUDA only"
            if not _cuda_only(options.device)
            else "no CUDA device"
            if cuda_count() == 0
            else ""
        )
        if why_not:
            return RuntimeChoice(None, f"--runtime auto: the engine's own loop ({why_not})")
    if own:
        raise RuntimeRefused(
            f"{', '.join(own)}: options of the engine's own loop (--runtime transformers); vLLM serves the "
            "checkpoint's own precision (an FP8 or 4-bit checkpoint for less memory)"
        )
    if attach:
        return _attached(options)
    executable = executable or find_vllm(options.vllm_command)
    if executable is None:
        raise RuntimeRefused(
            "--runtime vllm: no `vllm` on PATH; install vLLM (in an environment of its own: it pins its own torch) "
            "and name its executable with --vllm-command, or attach to a running one with --vllm-socket or --vllm-url"
        )
    visible, tensor_parallel = _gpus(options.device, cuda_count)
    server = VllmServer(socket_path=vllm_socket_beside(options.engine_socket), api_key=options.api_key)
    runtime = VllmRuntime(
        server=server,
        model_name=options.vllm_model,
        executable=executable,
        visible_devices=visible,
        tensor_parallel=tensor_parallel,
    )
    return RuntimeChoice(runtime, f"vLLM started by the engine ({executable})")


def _attached(options: ServeOptions) -> RuntimeChoice:
    """The vLLM already listening at ``--vllm-socket`` or ``--vllm-url``."""
    if options.vllm_command or options.device != "auto":
        raise RuntimeRefused(
            "--vllm-command and --device are for a vLLM the engine starts; the one at --vllm-socket or "
            "--vllm-url runs as it was started"
        )
    if plain_http_elsewhere(options.vllm_url) and not options.vllm_plain_http:
        raise RuntimeRefused(
            f"--vllm-url {redacted(options.vllm_url)}: completions would send your code (and the API key) "
            "unencrypted to another machine; use https:// (a TLS proxy in front of vLLM), or add "
            "--vllm-plain-http to send them anyway over a network you trust"
        )
    server = VllmServer(socket_path=options.vllm_socket, url=options.vllm_url, api_key=options.api_key)
    return RuntimeChoice(
        VllmRuntime(server=server, model_name=options.vllm_model), f"vLLM at {server.where()} (attached)"
    )


def _cuda_only(device: str) -> bool:
    parts = [part.strip() for part in device.split(",")]
    return device == "auto" or all(part.startswith("cuda") or part.isdigit() for part in parts)


def _gpus(device: str, cuda_count: Callable[[], int]) -> tuple[str, int]:
    """``CUDA_VISIBLE_DEVICES`` ("": as it is) and the tensor-parallel size for ``--device``: ``auto`` leaves vLLM
    its own choice (one GPU); ``cuda:N`` gives it that GPU; ``cuda:0,1`` both, split by tensor parallelism."""
    if device == "auto":
        return "", 1
    if not _cuda_only(device):
        raise RuntimeRefused(
            f"--device {device}: vLLM runs on GPUs only (cuda, cuda:N, cuda:0,1); for a CPU, a Mac or offloading, "
            "use --runtime transformers"
        )
    try:
        names = parse_devices(device, cuda_count(), mps=False).names
    except ModelLoadError as exc:
        raise RuntimeRefused(str(exc)) from None
    indices = [int(name.removeprefix("cuda:")) for name in names]
    # torch's cuda:N is the Nth of the GPUs the engine itself was given
    given = [part.strip() for part in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if part.strip()]
    return ",".join(given[index] if given else str(index) for index in indices), len(indices)
