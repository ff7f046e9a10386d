"""Shared fixtures: small real DiffusionGemma checkpoints and real engine processes."""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from filelock import FileLock

from tests.support.cache import CACHE_ENV, TEST_CACHE
from tests.support.xdg import xdg_environment

if TYPE_CHECKING:
    from tests.support.engine import EngineProcess

ROOT = Path(__file__).resolve().parents[1]
MODEL_CACHE = TEST_CACHE / "test-models"


SESSION_MARK = "DIFFGEMMA_TEST_SESSION"
"""An environment variable this test session sets for itself, so that every process a test starts (an engine, a
language server, an editor, and what they start in turn) carries it: what still carries it when the session ends
was left behind (``pytest_sessionfinish``)."""
LEFTOVER_GRACE_S = 30.0
"""How long the session's end waits for processes that are on their way out (an engine leaves within seconds of
its socket's folder being removed, or of its last client) before it calls them left behind."""


ONE_THREAD = "OMP_NUM_THREADS"
"""One torch thread in every process of the session unless the caller sets another count: the tests run many torch
processes at once (pytest-xdist's workers, their engines, language servers and builds), and two threads each on two
cores spent most of their time spinning for each other (five engine-heavy files on two workers: 282 CPU-s and 191 s
with torch's default of one thread per core, 111 CPU-s and 101 s with one)."""


ONE_HASH_SEED = "PYTHONHASHSEED"
"""One string hash seed for the processes the session starts (pytest-xdist's workers and the engines among them)
unless the caller sets one: the graphs torch.compile makes of the denoising step name their nodes in an order that
follows the seed, and inductor's FX graph cache keys on those names, so a fresh process missed a warm cache about
every other time (``test_static_step`` on one worker: 24 CPU-s with four cache hits, 42 with two misses and the
C++ builds they cost). The session's own process keeps the seed it started with."""


VLLM_CACHE = "VLLM_CACHE_ROOT"
"""vLLM's cache in the machine's test cache unless the caller sets one: each test gives its processes XDG folders
of their own, which put vLLM's cache there too, and vLLM then inspected the model's class in a process of its own
at every start (``python -m vllm.model_executor.models.registry``: 6 to 9 CPU-s, four times a session), where a
cached inspection, keyed by a hash of the model's module, is read in milliseconds. Each vLLM install the tests run
keeps a folder of its own in it (tests/support/vllm_cpu.py, tests/support/vllm_check.py)."""


def pytest_configure(config: pytest.Config) -> None:
    os.environ[CACHE_ENV] = str(TEST_CACHE)  # for what the session starts, whatever XDG_CACHE_HOME it is given
    os.environ.setdefault(ONE_THREAD, "1")  # before any test module imports torch
    os.environ.setdefault(ONE_HASH_SEED, "0")  # before pytest-xdist starts its workers
    os.environ.setdefault(VLLM_CACHE, str(TEST_CACHE / "vllm-cache"))
    if _is_worker(config) and os.environ.get(SESSION_MARK):
        return  # a pytest-xdist worker keeps the mark of the run that started it
    os.environ[SESSION_MARK] = f"{os.getpid()}-{time.time_ns()}"


def _is_worker(config: pytest.Config) -> bool:
    """Whether this process is one of pytest-xdist's workers (``make test`` runs one per core)."""
    return hasattr(config, "workerinput")


def _parent(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def _background_env() -> dict[str, str]:
    """The environment of the builders started in the background (a checkpoint, the vLLM environment): not marked,
    as they may go on after a session stopped early (the next run waits on their lock)."""
    return {name: value for name, value in os.environ.items() if name != SESSION_MARK}


def _marked_processes(workers: bool = False) -> dict[int, str]:
    """The processes other than this one that carry this session's mark, with their command lines; with
    ``workers``, not this process's children either (pytest-xdist's workers, which tests do not start)."""
    mark = f"{SESSION_MARK}={os.environ.get(SESSION_MARK, '')}".encode()
    found = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        if int(pid) == os.getpid() or (workers and _parent(int(pid)) == os.getpid()):
            continue
        try:
            if mark not in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
                continue
            command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:  # gone, or not ours to read
            continue
        if command:  # a zombie has none: its parent reaps it
            found[int(pid)] = command.strip()
    return found


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Fail the run when a process a test started (an engine, a language server, an editor) outlives the session;
    stop each such process (by its id) so that ``make test`` leaves nothing behind either way."""
    if not os.path.isdir("/proc") or _is_worker(session.config):
        return
    workers = session.config.pluginmanager.has_plugin("dsession")  # tests ran in pytest-xdist's workers
    deadline = time.monotonic() + LEFTOVER_GRACE_S
    while (left := _marked_processes(workers)) and time.monotonic() < deadline:
        time.sleep(0.5)
    if not left:
        return
    for signum in (signal.SIGTERM, signal.SIGKILL):  # an engine removes its socket on SIGTERM
        for pid in left:
            with contextlib.suppress(OSError):
                os.kill(pid, signum)
        time.sleep(2)
    report = "\n".join(f"  {pid}: {command[:300]}" for pid, command in sorted(left.items()))
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    message = f"processes started by the tests were still running when the session ended (now killed):\n{report}"
    if reporter is not None:
        reporter.ensure_newline()
        reporter.write_line(message, red=True)
    else:
        print(message, file=sys.stderr)
    session.exitstatus = pytest.ExitCode.TESTS_FAILED


# Lightest first, real processes and editors last (pygls reorders its end-to-end tests the same way): a broken
# unit fails in seconds, before the slow layers start. Folders not named here run between the engine's and the
# reliability tests.
LAYER_ORDER = ("lsp", "protocol", "lsp_server", "engine", "benchmarks", "reliability", "e2e")


def _layer_rank(item: pytest.Item) -> tuple[int, bool]:
    """Where a test runs: its folder's place in LAYER_ORDER, then tests marked e2e after the others of that folder;
    the files of a ``ONE_WORKER`` group right after the light layers (before the engine's), whatever their folder:
    they run one after the other on one worker (over four minutes for the vLLM group), and last they kept that
    worker busy for minutes after the other had finished (half the machine idle: 893 s of pytest on a quiet fresh
    clone, its last 100 s so)."""
    path = Path(item.path)
    relative = path.relative_to(ROOT / "tests") if path.is_relative_to(ROOT / "tests") else None
    if _file_of(item.nodeid) in ONE_WORKER:
        return 2 * LAYER_ORDER.index("engine") - 1, False
    folder = relative.parts[0] if relative is not None else ""
    rank = 2 * LAYER_ORDER.index(folder) if folder in LAYER_ORDER else 2 * LAYER_ORDER.index("engine") + 1
    return rank, item.get_closest_marker("e2e") is not None


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Run the layers in LAYER_ORDER; within a layer, the files that wait for something built in the background
    (``BUILT_BESIDE``) after those that do not, so that the tests keep a core busy while the building takes the
    other. The sort is stable and moves whole files, so each file keeps its own order and its module fixtures."""
    waits: dict[Path, bool] = {}
    for item in items:
        path = Path(item.path)
        waits[path] = waits.get(path, False) or bool(BUILT_BESIDE & set(getattr(item, "fixturenames", ())))
    items.sort(key=lambda item: (*_layer_rank(item), waits[Path(item.path)]))


def _file_of(nodeid: str) -> str:
    """The file part of a test's node id (``tests/e2e/test_real_vllm.py``): the key of ``ONE_WORKER``, as
    pytest-xdist's ``--dist loadfile`` names the file it hands out (its ``_split_scope``)."""
    return nodeid.split("::", 1)[0]


ONE_WORKER = {"tests/e2e/test_real_vllm.py": "vllm", "tests/e2e/test_real_vllm_lifecycle.py": "vllm"}
"""Files that pytest-xdist hands to one worker together (``make test``), one after the other, by a
name of their group: the files that serve models with vLLM's CPU build (two servers for one, three starts for the
other), which would otherwise start up to five ``vllm serve`` at once on several workers, each with its gigabyte of KV
cache and a minute of start on a shared core."""


def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """For pytest-xdist's ``--dist loadfile`` (whole files to a worker), the files of a ``ONE_WORKER`` group taken
    as one file; they are handed out in the order of ``pytest_collection_modifyitems`` (``make test`` passes
    ``--no-loadscope-reorder``: xdist would otherwise start the files with the most tests first). Another ``--dist``
    is xdist's own (None)."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class Scheduling(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            file = super()._split_scope(nodeid)
            return ONE_WORKER.get(file, file)

    return Scheduling(config, log)


TRAINED = {
    "memorized_model_dir": ("memorized", "tests.support.models", "build_memorized"),
    "release_memorized_dir": ("release-memorized", "tests.support.release_format", "build_release_memorized"),
    "next_edit_model_dir": ("next-edit", "tests.support.models", "build_next_edit"),
    "single_line_model_dir": ("single-line", "tests.support.models", "build_single_line"),
    "next_edit_chain_model_dir": ("next-edit-chain", "tests.support.models", "build_next_edit_chain"),
}
"""The checkpoints trained for the tests (a minute or two each, on one thread), by the fixture that gives them."""
BUILT_BESIDE = {*TRAINED, "vllm_python", "vllm_cpu"}
"""The fixtures whose work starts in the background when collection ends (``pytest_collection_finish``)."""


def pytest_collection_finish(session: pytest.Session) -> None:
    """Train the checkpoints the collected tests will need and the cache lacks, each in a background process on its
    own thread, while the light layers run: their fixtures then wait on the checkpoint's lock instead of training
    one after the other when first asked. A run that needs none (``pytest tests/lsp``) starts none."""
    if _is_worker(session.config) and session.config.workerinput["workerid"] != "gw0":
        return  # each pytest-xdist worker collects every test: the first starts the builds, the others wait on them
    asked = {fixture for item in session.items for fixture in getattr(item, "fixturenames", ())}
    if "vllm_python" in asked:  # mostly downloading and unpacking: beside the tests, not before them
        from tests.support.vllm_env import RECIPE, VENV

        done = VENV / ".complete"
        if not (done.is_file() and done.read_text() == RECIPE):
            code = "from tests.support.vllm_env import vllm_python; vllm_python()"
            _build_beside(code, VENV.parent / f"{VENV.name}.build.log")
    if "vllm_cpu" in asked:  # vLLM's CPU build, 3.5 GB: downloading and unpacking too
        from tests.support.vllm_cpu import HOME, RECIPE

        done = HOME / ".complete"
        if not (done.is_file() and done.read_text() == RECIPE):
            code = "from tests.support.vllm_cpu import build_vllm_cpu; build_vllm_cpu()"
            _build_beside(code, HOME.parent / f"{HOME.name}.beside.log")  # pip's own output: .build.log
    for fixture in sorted(asked & set(TRAINED)):
        name, module, function = TRAINED[fixture]
        if not (_checkpoint_path(name) / "config.json").is_file():
            code = f"from tests.conftest import _cached_checkpoint; from {module} import {function}; "
            code += f"_cached_checkpoint({name!r}, {function})"
            _build_beside(code, MODEL_CACHE / f"{name}.build.log")


def _build_beside(code: str, log_path: Path) -> None:
    """Run ``code`` in a background process of this project's Python (a build the tests will wait for), its output
    in ``log_path``; unmarked as the session's process (``_background_env``), since a build may outlive a short run."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("w") as log:
        command = [sys.executable, "-c", code]
        subprocess.Popen(command, cwd=ROOT, stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=_background_env())


@pytest.fixture(scope="session")
def vllm_python() -> Path:
    """The Python of a venv holding vLLM's own request code (tests/support/vllm_env.py)."""
    from tests.support.vllm_env import vllm_python as build

    return build()


SESSION_STARTED = time.time()
"""When this test session began: a background build that failed since is not tried again (``vllm_cpu``)."""


@pytest.fixture(scope="session")
def vllm_cpu() -> Path:
    """The ``vllm`` of vLLM's CPU build (tests/support/vllm_cpu.py); skips, saying why, where it cannot be built."""
    from tests.support.vllm_cpu import vllm_cpu_or_skip

    return vllm_cpu_or_skip(SESSION_STARTED)


_TRAINING = ("tests/support/models.py", "engine/training/configs.py")
"""What every checkpoint is built by (release_format.py uses the models' training loop and the configs' towers)."""
_RELEASE = (*_TRAINING, "tests/support/release_format.py", "tests/data/release/config.json")
_RELEASE += ("tests/data/release/generation_config.json",)
_PROMPT = ("engine/shared/prompt.py", "engine/shared/budget.py")
"""The engine's prompt layout: what a memorized checkpoint answers is the prompt it lays out."""
_SHIPPED_TOKENIZER = ("engine/default_model/tokenizer.json", "engine/default_model/tokenizer_config.json")
CHECKPOINT_SOURCES: dict[str, tuple[str, ...]] = {
    "random": (*_TRAINING, *_SHIPPED_TOKENIZER),
    "memorized": (*_TRAINING, *_SHIPPED_TOKENIZER, *_PROMPT),
    "single-line": (*_TRAINING, *_SHIPPED_TOKENIZER, *_PROMPT),
    "next-edit": (*_TRAINING, *_SHIPPED_TOKENIZER, *_PROMPT, "tests/support/next_edits.py"),
    "next-edit-chain": (*_TRAINING, *_SHIPPED_TOKENIZER, *_PROMPT, "engine/request/windows.py"),
    "release-random": _RELEASE,
    "release-wide": _RELEASE,
    "release-memorized": (*_RELEASE, *_PROMPT),
}
"""The files each test checkpoint is built from, by its name: it is trained again when one of them changes (and on
another transformers), not when code it does not depend on does (an edit or a move elsewhere kept every checkpoint
of the checkout training anew, minutes each on this machine). The next-edit checkpoint also depends on the
requests the language server builds (``_next_edit_requests``), read as they are sent rather than from the files
that build them."""


def _next_edit_requests() -> bytes:
    """The requests the next-edit checkpoint is trained to answer, as the language server sends them."""
    from diffgemma_engine.shared import frames
    from tests.support.next_edits import next_edit_requests

    return b"".join(frames.encode(request) for request in next_edit_requests("file:///work/area.py"))


def _chain_requests() -> bytes:
    """The requests the next-edit chain checkpoint is trained to answer, as the language server sends them, and the
    answers (its module's other code changes nothing it is trained on)."""
    from diffgemma_engine.shared import frames
    from tests.support.next_edit_chain import FOLLOWED_LINES, chain_requests

    requests = chain_requests("file:///work/totals.py")
    return b"".join(frames.encode(request) for request in requests) + "".join(FOLLOWED_LINES).encode()


REQUESTS = {"next-edit": _next_edit_requests, "next-edit-chain": _chain_requests}
"""The checkpoints that depend on the requests the language server builds, and how to read them."""


def _checkpoint_path(name: str) -> Path:
    """Where the checkpoint ``name`` is cached for this version of what it is built from (``CHECKPOINT_SOURCES``)."""
    import torch
    import transformers

    digest = hashlib.sha1()
    for path in CHECKPOINT_SOURCES[name]:
        digest.update((ROOT / path).read_bytes())
    if name in REQUESTS:
        digest.update(REQUESTS[name]())
    digest.update(transformers.__version__.encode())
    digest.update(torch.__version__.encode())  # the cache is the machine's: clones may have other builds
    return MODEL_CACHE / f"{name}-{digest.hexdigest()[:12]}"


def _cached_checkpoint(name: str, build) -> Path:
    """Build a checkpoint once per version of the code that builds it (kept under .cache/)."""
    target = _checkpoint_path(name)
    MODEL_CACHE.mkdir(parents=True, exist_ok=True)
    # Runs sharing this checkout (or pytest-xdist's workers) build a checkpoint once: the others wait for it.
    with FileLock(MODEL_CACHE / f"{target.name}.lock"):
        if not (target / "config.json").is_file():
            scratch = Path(tempfile.mkdtemp(dir=MODEL_CACHE))
            build(scratch / name)
            shutil.rmtree(target, ignore_errors=True)
            (scratch / name).rename(target)
            shutil.rmtree(scratch, ignore_errors=True)
    return target


@pytest.fixture(scope="session")
def random_model_dir() -> Path:
    """A random-weight DiffusionGemma (its canvases never settle, so every step runs)."""
    from tests.support.models import build_random

    return _cached_checkpoint("random", build_random)


@pytest.fixture(scope="session")
def memorized_model_dir() -> Path:
    """A DiffusionGemma trained to answer ``MEMORIZED_MIDDLE`` to ``MEMORIZED_PREFIX``."""
    from tests.support.models import build_memorized

    return _cached_checkpoint("memorized", build_memorized)


@pytest.fixture(scope="session")
def single_line_model_dir() -> Path:
    """A DiffusionGemma trained to answer ``SINGLE_LINE_MIDDLE`` (one line, mid-line) to ``SINGLE_LINE_PREFIX``."""
    from tests.support.models import build_single_line

    return _cached_checkpoint("single-line", build_single_line)


@pytest.fixture(scope="session")
def next_edit_model_dir() -> Path:
    """A DiffusionGemma trained to make the next edit of ``tests/support/next_edits.py`` (``FOLLOWED``)."""
    from tests.support.models import build_next_edit

    return _cached_checkpoint("next-edit", build_next_edit)


@pytest.fixture(scope="session")
def next_edit_chain_model_dir() -> Path:
    """A DiffusionGemma trained to make the three edits of the chain of ``tests/support/next_edit_chain.py``."""
    from tests.support.models import build_next_edit_chain

    return _cached_checkpoint("next-edit-chain", build_next_edit_chain)


@pytest.fixture(scope="session")
def release_random_dir() -> Path:
    """A random-weight checkpoint in the released DiffusionGemma-IT's on-disk format (chat template, Gemma 4
    control tokens, sharded bf16 weights, the release's generation config): every one of its 48 steps runs."""
    from tests.support.release_format import build_release_random

    return _cached_checkpoint("release-random", build_release_random)


@pytest.fixture(scope="session")
def release_memorized_dir() -> Path:
    """The release format, trained to answer ``RAW_ANSWER`` (fenced) to the chat prompt for ``ANSWERED_PREFIX``."""
    from tests.support.release_format import build_release_memorized

    return _cached_checkpoint("release-memorized", build_release_memorized)


@pytest.fixture(scope="session")
def release_wide_dir() -> Path:
    """The release format with random weights at ``release_format.WIDE`` sizes (about 90 MB of bf16)."""
    from tests.support.release_format import build_release_wide

    return _cached_checkpoint("release-wide", build_release_wide)


@pytest.fixture(scope="session")
def release_tokenizer(release_random_dir: Path):
    """The release-format checkpoint's tokenizer, loaded as the engine loads it."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(release_random_dir, local_files_only=True)


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A private temp dir with a short path (Unix socket paths are limited to ~107 bytes)."""
    path = Path(tempfile.mkdtemp(prefix="dg-", dir="/tmp"))
    os.chmod(path, 0o700)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def isolated_env(short_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """XDG directories inside the test's temp dir, so nothing touches the user's own."""
    for name, value in xdg_environment(short_tmp).items():
        monkeypatch.setenv(name, value)
    return short_tmp


@pytest.fixture(scope="module")
def module_tmp() -> Iterator[Path]:
    """A private short temp dir shared by one test module (for servers that several tests talk to)."""
    path = Path(tempfile.mkdtemp(prefix="dgm-", dir="/tmp"))
    os.chmod(path, 0o700)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def memorized_engine(memorized_model_dir: Path, module_tmp: Path) -> Iterator[EngineProcess]:
    """One engine on the memorized checkpoint shared by a module's tests (an engine costs seconds of imports and
    loading to start): for the tests that neither stop, restart nor reconfigure theirs. A language server attaches
    to it with ``--engine-socket`` and no model (``tests.support.lsp.server_command``)."""
    from tests.support.engine import EngineProcess

    engine = EngineProcess(memorized_model_dir, module_tmp / "engine.sock", module_tmp / "engine.log")
    try:
        yield engine
    finally:
        engine.stop()
