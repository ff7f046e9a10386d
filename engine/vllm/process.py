"""A vLLM server the engine runs itself (``serve --runtime vllm`` without ``--vllm-socket`` or ``--vllm-url``):
``vllm serve`` of the checkpoint on a Unix socket in the engine's private runtime directory, with the options of
vLLM's DiffusionGemma recipe; watched while it loads (its last output line is the loading's progress, in ``state``),
restarted with backoff when it dies (reported once per exit, with its output's last lines), stopped with the engine
(and, on Linux, when the engine dies without stopping it).

``VllmSupervisor`` also watches a vLLM the engine attached to: its ``/health``, for ``diffgemma-lsp doctor``.
Standard library only: the thread that runs it never touches the model."""

from __future__ import annotations

import collections
import contextlib
import ctypes
import json
import logging
import math
import os
import signal
import stat
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import attrs

from ..shared import protocol
from ..shared.socket_paths import check_socket_dir, is_listening
from .client import VllmError, VllmServer, wait_until_healthy

logger = logging.getLogger(__name__)

RECIPE_MAX_NUM_SEQS = 4
"""vLLM's DiffusionGemma recipe: 4 to 8 sequences at once (its sampler pre-allocates vocabulary buffers per
sequence; more runs out of memory on one H200)."""
HEALTH_POLL_S = 5.0
"""How often a running vLLM's ``/health`` is asked (and, for one the engine runs, whether it has exited)."""
BACKOFF_S = (1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 60.0)
"""The waits before each restart in a row of crashes; a start that became healthy begins the row again."""
TAIL_LINES = 20
"""Lines of vLLM's output kept for the report of a failed start or a crash."""
READER_DRAIN_S = 1.0
"""How long a report of an exit waits for vLLM's last output lines."""
STOP_GRACE_S = 30.0
"""How long a stopping vLLM has after SIGTERM before SIGKILL."""
HEALTHY = protocol.RUNTIME_HEALTHY


def serve_command(
    vllm: Path, folder: Path, socket_path: Path, canvas_length: int, max_steps: int, tensor_parallel: int = 1
) -> list[str]:
    """``vllm serve`` of the checkpoint in ``folder`` on ``socket_path``, at the engine's served canvas and its
    schedule's steps (each request caps its own with ``diffusion_max_steps``), as vLLM's recipe runs it."""
    diffusion = {"canvas_length": canvas_length, "max_denoising_steps": max_steps}
    command = [str(vllm), "serve", str(folder), "--uds", str(socket_path)]
    command += ["--diffusion-config", json.dumps(diffusion), "--max-num-seqs", str(RECIPE_MAX_NUM_SEQS)]
    command += ["--enable-prefix-caching"]  # the engine's stable prompt head is read from the cache
    command += ["--enable-prompt-tokens-details"]  # else its replies do not say how much of it was
    if tensor_parallel > 1:
        command += ["--tensor-parallel-size", str(tensor_parallel)]
    return command


def clear_stale_socket(path: Path) -> None:
    """Remove the socket file a vLLM left at ``path``: vLLM binds its ``--uds`` path before it loads and never
    removes it, not even on a clean SIGTERM, and the next ``vllm serve --uds`` on it fails at once ("Address already
    in use"). Only a socket that nothing listens on, in a directory of this user's that no one else can write to
    (the engine's private runtime directory); ``VllmError`` saying why when it is anything else."""
    check_socket_dir(path.parent)
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(info.st_mode):
        raise VllmError(f"{path} is there and is not a socket: not removed, and vLLM cannot listen on it")
    if is_listening(path):
        raise VllmError(f"a process already listens on {path} (a vLLM an earlier engine started?): stop it first")
    path.unlink()


@attrs.frozen(kw_only=True)
class Launch:
    """How to start vLLM: its command line and what its environment adds (``CUDA_VISIBLE_DEVICES``)."""

    command: Sequence[str]
    env: Mapping[str, str] = attrs.field(factory=dict)


def _die_with_parent() -> Callable[[], None] | None:
    """On Linux, a ``preexec_fn`` that asks the kernel to SIGTERM the child when the thread that started it ends
    (the supervising thread, which lives until vLLM is stopped): an engine killed with SIGKILL does not leave a
    vLLM holding the GPU. The C function is looked up before the fork; the child only calls it."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    pr_set_pdeathsig = 1

    def set_death_signal() -> None:
        prctl(pr_set_pdeathsig, int(signal.SIGTERM), 0, 0, 0)

    return set_death_signal


class VllmSupervisor:
    """Starts (with ``launch``) or attaches to the vLLM at ``server``, waits until it answers ``/health``, then
    watches it: ``state()`` for stats and doctor, ``down_reason()`` for a request that could not reach it,
    ``stop()`` when the engine stops."""

    def __init__(self, server: VllmServer, launch: Launch | None = None) -> None:
        self.server = server
        self.launch = launch
        self.restarts = 0
        self._lock = threading.Lock()
        self._state = "starting vLLM" if launch is not None else f"waiting for vLLM at {server.where()}"
        self._process: subprocess.Popen[bytes] | None = None
        self._tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
        self._reader: threading.Thread | None = None
        """Reads the running vLLM's output into ``_tail``."""
        self._stopping = threading.Event()
        self._ready = threading.Event()
        """Set once vLLM first answered ``/health``, or its first start failed."""
        self._loading = launch is not None
        """Between a start and its first healthy answer (its output is then the loading's progress)."""
        self._failure: str | None = None
        self._thread = threading.Thread(target=self._run, name="diffgemma-vllm", daemon=True)

    def start(self) -> None:
        """Start (or attach) and watch, on a thread of its own."""
        self._thread.start()

    def wait_ready(self, timeout_s: float) -> None:
        """Return once vLLM first answers ``/health``; ``VllmError`` saying why when it exited first (with its
        output's last lines) or did not answer within ``timeout_s``."""
        if not self._ready.wait(timeout_s):
            raise VllmError(f"vLLM at {self.server.where()} did not answer /health within {timeout_s:.0f} s")
        if self._failure is not None:
            raise VllmError(self._failure)

    def state(self) -> str:
        """``healthy``, or what it is doing instead (starting: its last output line; restarting: why)."""
        with self._lock:
            return self._state

    def down_reason(self) -> str | None:
        """Why a request cannot reach vLLM now (None while it is healthy, or as far as is known)."""
        state = self.state()
        return None if state == HEALTHY else f"vLLM is not serving: {state}"

    def pid(self) -> int | None:
        """The process of the vLLM this engine runs (None: attached, or none running)."""
        process = self._process
        return process.pid if process is not None and process.poll() is None else None

    def stop(self, grace_s: float = STOP_GRACE_S) -> None:
        """Stop watching; a vLLM this engine started gets SIGTERM (its process group: vLLM's own engine
        processes too), then SIGKILL after ``grace_s``."""
        self._stopping.set()
        with self._lock:
            process = self._process
        if process is not None:
            _terminate(process, grace_s)
        if self._thread.is_alive():
            self._thread.join(HEALTH_POLL_S + 1.0)

    def _set_state(self, state: str) -> None:
        with self._lock:
            self._state = state

    def _run(self) -> None:
        crashes_in_a_row = 0
        while not self._stopping.is_set():
            if self.launch is not None and not self._spawn():
                return
            if not self._until_healthy():
                if not self._ready.is_set():  # the first start failed: the engine reports it and exits
                    self._failure = self._exit_report("did not start")
                    self._set_state(self._failure)
                    self._ready.set()
                    return
            else:
                crashes_in_a_row = 0
                self._loading = False
                self._set_state(HEALTHY)
                self._ready.set()
                self._watch()
            if self._stopping.is_set() or self.launch is None:
                return
            delay = BACKOFF_S[min(crashes_in_a_row, len(BACKOFF_S) - 1)]
            crashes_in_a_row += 1
            self.restarts += 1
            report = self._exit_report("exited")
            logger.warning("%s; restarting it in %.0f s (restart %d)", report, delay, self.restarts)
            self._set_state(f"restarting in {delay:.0f} s (restart {self.restarts}): {report}")
            if self._stopping.wait(delay):
                return

    def _spawn(self) -> bool:
        """Start vLLM (False when the engine is stopping, or the command cannot run at all)."""
        assert self.launch is not None
        self._tail.clear()
        env = {**os.environ, **self.launch.env}
        logger.info("starting vLLM: %s", " ".join(self.launch.command))
        with self._lock:
            if self._stopping.is_set():
                return False
            try:
                if self.server.socket_path is not None:
                    clear_stale_socket(self.server.socket_path)  # the last vLLM's, even after a clean stop
                self._process = subprocess.Popen(
                    list(self.launch.command),
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    env=env,
                    start_new_session=True,  # its own process group: stopped as a whole
                    preexec_fn=_die_with_parent(),  # only a C call, looked up before the fork
                )
            except (OSError, VllmError) as exc:
                self._failure = f"cannot run {self.launch.command[0]}: {exc}"
                self._state = self._failure
                self._ready.set()
                return False
            self._state = "starting vLLM"
            self._loading = True
        self._reader = threading.Thread(target=self._read_output, args=(self._process,), daemon=True)
        self._reader.start()
        return True

    def _read_output(self, process: subprocess.Popen[bytes]) -> None:
        """vLLM's output, line by line: kept as the tail; in the engine's log (at info while it loads, as its
        progress, then at debug: vLLM logs every request)."""
        assert process.stdout is not None
        for raw in process.stdout:
            line = raw.decode(errors="replace").rstrip()
            if not line:
                continue
            self._tail.append(line)
            logger.log(logging.INFO if self._loading else logging.DEBUG, "vllm: %s", line)
            if self._loading and self.state().startswith("starting"):
                self._set_state(f"starting: {line[-200:]}")

    def _alive(self) -> bool:
        process = self._process
        return not self._stopping.is_set() and (process is None or process.poll() is None)

    def _until_healthy(self) -> bool:
        """Poll ``/health`` until it answers (True), or the process exits or the engine stops (False)."""
        return wait_until_healthy(self.server, math.inf, self._alive)

    def _watch(self) -> None:
        """While it runs: ``/health`` every ``HEALTH_POLL_S``; return when the process exits or the engine stops (an
        attached vLLM is watched until then)."""
        while not self._stopping.wait(HEALTH_POLL_S):
            process = self._process
            if process is not None and process.poll() is not None:
                return
            healthy = self.server.healthy()
            if not self._stopping.is_set():
                self._set_state(HEALTHY if healthy else f"not answering /health at {self.server.where()}")

    def _exit_report(self, what: str) -> str:
        """ "vLLM exited with status N: its last lines", or, attached, that it stopped answering."""
        process = self._process
        if process is None:
            return f"vLLM at {self.server.where()} stopped answering /health"
        status = process.wait()
        with contextlib.suppress(ProcessLookupError, PermissionError):  # its engine processes: the GPU, the socket
            os.killpg(process.pid, signal.SIGKILL)
        if self._reader is not None:  # its last lines (vLLM's own children may hold the pipe open: not forever)
            self._reader.join(READER_DRAIN_S)
        tail = " | ".join(list(self._tail)[-5:]) or "(no output)"
        return f"vLLM {what} (exit status {status}): {tail}"


def _terminate(process: subprocess.Popen[bytes], grace_s: float) -> None:
    """SIGTERM to the process's group, SIGKILL after ``grace_s``."""
    if process.poll() is not None:
        return
    for signum, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(process.pid, signum)
        except ProcessLookupError:
            return
        try:
            process.wait(wait_s)
            return
        except subprocess.TimeoutExpired:
            continue


@attrs.frozen(kw_only=True)
class VllmRuntime:
    """``serve --runtime vllm``: the vLLM server that runs the canvases, and, when the engine runs it itself, its
    ``vllm`` executable and the GPUs it gets."""

    server: VllmServer
    model_name: str = ""
    """The served model's name in each request ("": the one it serves)."""
    executable: Path | None = None
    """The ``vllm`` command the engine runs on ``server.socket_path``; None: attach to a vLLM already listening."""
    visible_devices: str = ""
    """``CUDA_VISIBLE_DEVICES`` for it ("": the environment's own)."""
    tensor_parallel: int = 1

    def supervisor(self, folder: Path, canvas_length: int, max_steps: int) -> VllmSupervisor:
        """The supervisor that starts (or attaches to) and watches this vLLM, for the checkpoint in ``folder``."""
        if self.executable is None:
            return VllmSupervisor(self.server)
        if self.server.socket_path is None:
            raise ValueError("a vLLM the engine runs listens on a Unix socket")
        command = serve_command(
            self.executable, folder, self.server.socket_path, canvas_length, max_steps, self.tensor_parallel
        )
        env = {"CUDA_VISIBLE_DEVICES": self.visible_devices} if self.visible_devices else {}
        return VllmSupervisor(self.server, Launch(command=command, env=env))
