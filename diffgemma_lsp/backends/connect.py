"""Find or start the backend the settings name: the remote server, or the local engine, which is started as a
detached process (outliving this language server, serving every window) when none runs."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import attrs

from diffgemma_engine.shared import logfile, socket_paths
from diffgemma_engine.shared.serve_options import Runtime, ServeOptions
from diffgemma_lsp.backends.base import Backend, BackendState, StateListener
from diffgemma_lsp.backends.local import EngineClient, ExitCheck
from diffgemma_lsp.settings import Settings

logger = logging.getLogger(__name__)


def engine_log_path() -> Path:
    """Where a started engine writes its log."""
    return logfile.state_folder() / "engine.log"


def engine_command(socket_path: Path, engine: EngineSettings, log_path: Path | None = None) -> list[str]:
    """The command line of an engine for ``socket_path`` started with ``engine``'s settings: its ``serve``
    options written by the engine's own declaration of them (``diffgemma_engine.shared.serve_options``)."""
    options = engine.serve_options(socket_path)
    return [sys.executable, "-m", "diffgemma_engine", "--log-file", str(log_path or engine_log_path()), *options.argv()]


def _log_folder() -> Path:
    """The folder for the engine's log and error output: the state directory, else (read-only) a private
    temporary one, so that a start failure is never invisible."""
    folder = engine_log_path().parent
    try:
        logfile.private_folder(folder)
        probe = folder / ".diffgemma-write-test"
        probe.touch()
        probe.unlink()
        logfile.create_private(folder / "engine.log")  # not a folder
        return folder
    except OSError as exc:
        fallback = Path(tempfile.mkdtemp(prefix="diffgemma-logs-"))
        logger.warning("cannot write the engine's log in %s (%s); using %s", folder, exc, fallback)
        return fallback


STDERR_FILE = "engine.stderr"
TAIL_CHARS = 600


@attrs.frozen
class StartedEngine:
    """An engine this process started, and the folder of its log and error output."""

    process: subprocess.Popen[bytes]
    folder: Path

    def exit_reason(self) -> str | None:
        """Why it is gone: its exit status and the end of its error output (else its log's last line); None while
        it runs, or when it exited 0 (another engine took the socket first: that one serves)."""
        status = self.process.poll()
        if status is None or status == 0:
            return None
        tails: tuple[tuple[str, Callable[[str], str]], ...] = (
            (STDERR_FILE, lambda text: text),
            ("engine.log", lambda text: text.splitlines()[-1]),
        )
        for name, tail in tails:
            try:
                text = (self.folder / name).read_text(errors="replace").strip()
            except OSError:
                continue
            if text:
                return f"the engine exited with status {status}: {tail(text[-TAIL_CHARS:])}"
        return f"the engine exited with status {status} (no output; see {self.folder})"


@attrs.frozen(kw_only=True)
class EngineSettings:
    """What an engine this server starts is started with (the settings of the same names)."""

    model: str | None = None
    device: str = "auto"
    quantization: str = ""
    idle_exit_minutes: int | None = None
    runtime: str = "auto"
    vllm_command: str = ""
    step_mode: str = "auto"

    @classmethod
    def of(cls, settings: Settings) -> EngineSettings:
        return cls(
            model=settings.model,
            device=settings.device,
            quantization=settings.quantization,
            idle_exit_minutes=settings.engine_idle_exit_minutes,
            runtime=settings.runtime,
            vllm_command=settings.vllm_command,
            step_mode=settings.step_mode,
        )

    def serve_options(self, socket_path: Path) -> ServeOptions:
        """The ``serve`` options of an engine on ``socket_path`` with these settings (it exits 0 when another
        already serves that socket)."""
        minutes = self.idle_exit_minutes
        return ServeOptions(
            engine_socket=socket_path,
            model=os.path.expanduser(self.model) if self.model else None,  # a folder, or a hub id as written
            device=self.device,
            quantization=self.quantization or None,
            idle_exit=None if minutes is None else float(minutes * 60),  # None: auto, by what reloading costs
            exist_ok=True,
            runtime=Runtime(self.runtime),
            step=self.step_mode,
            vllm_command=os.path.expanduser(self.vllm_command) if self.vllm_command else "",
        )

    def socket_path(self) -> Path:
        """The socket of the engine that serves these settings (the default engine's for the defaults)."""
        options = {
            "runtime": self.runtime if self.runtime != "auto" else "",
            "vllm_command": self.vllm_command,
            "step": self.step_mode if self.step_mode != "auto" else "",
        }
        given = {name: value for name, value in options.items() if value}
        return socket_paths.socket_path_for(self.model, self.device, self.quantization, given)


def spawn_engine(socket_path: Path, engine: EngineSettings) -> StartedEngine:
    """Start an engine in its own session; its stdout never reaches the LSP's stdout, and its error output goes
    to ``engine.stderr`` beside its log (read by ``StartedEngine.exit_reason`` if it exits before serving)."""
    folder = _log_folder()
    command = engine_command(socket_path, engine, folder / "engine.log")
    logger.info("starting engine: %s", " ".join(command))
    stderr = os.open(folder / STDERR_FILE, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        process = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            start_new_session=True,
            close_fds=True,
        )
    finally:
        os.close(stderr)
    return StartedEngine(process, folder)


def local_backend(
    engine_socket: Path | None,
    engine: EngineSettings,
    on_state: StateListener | None,
    client_name: str = "diffgemma-lsp",
) -> EngineClient:
    """A started client of the engine on ``engine_socket`` (None: the one for ``engine``'s settings), which starts
    that engine when none runs there."""
    socket_path = engine_socket or engine.socket_path()

    async def start_engine() -> ExitCheck:
        return spawn_engine(socket_path, engine).exit_reason

    client = EngineClient(socket_path, start_engine, on_state, client_name=client_name)
    client.start()
    return client


def connect(settings: Settings, engine_socket: Path | None, on_state: StateListener) -> Backend | None:
    """The started backend ``settings`` name (``engine_socket``: the local engine's, when given); None, reported
    to ``on_state`` as failed, when the settings lack what it needs."""
    if settings.backend == "openai":
        if not settings.openai_url:
            on_state(BackendState.FAILED, "the openai backend needs the openaiUrl setting")
            return None
        from diffgemma_lsp.backends.remote import OpenAIBackend  # aiohttp: a fifth of the server's start, when used

        remote = OpenAIBackend(
            settings.openai_url,
            model=settings.openai_model,
            api_key_env=settings.openai_api_key_env,
            prompt_format=settings.openai_prompt_format,
            on_state=on_state,
        )
        remote.start()
        return remote
    return local_backend(engine_socket, EngineSettings.of(settings), on_state)
