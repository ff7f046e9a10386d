"""Hub ids: ``diffgemma-engine pull`` downloads what loading needs into huggingface_hub's cache, resumably; a cached
id serves and infills with ``HF_HUB_OFFLINE=1`` and no network; ``plan ID`` fetches ``config.json`` alone.

The hub here is a stand-in (``tests.support.hub``): no machine here reaches the Hugging Face Hub, so the real
huggingface_hub client, in real engine processes, talks HTTP to a local server that answers the calls the hub
answers, serving the release-format test checkpoint as ``google/diffusiongemma-26B-A4B-it``."""

from __future__ import annotations

import hashlib
import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from diffgemma_engine.loading.hub import LOAD_PATTERNS
from diffgemma_engine.shared import protocol
from tests.support.engine import EngineProcess, RawClient
from tests.support.hub import StandInHub, serve_hub

RELEASE_ID = "google/diffusiongemma-26B-A4B-it"
SHARD = "model-00002-of-00006.safetensors"


@pytest.fixture
def hub(release_random_dir: Path) -> Iterator[StandInHub]:
    with serve_hub({RELEASE_ID: release_random_dir}) as running:
        yield running


@pytest.fixture
def hub_env(hub: StandInHub, short_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """An environment whose hub is the stand-in and whose hub cache is empty and private to the test."""
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    monkeypatch.setenv("HF_HOME", str(short_tmp / "hf"))
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_HUB_CACHE", "HF_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    return dict(os.environ)


def _engine(*args: str, env: dict[str, str], prelude: str = "") -> subprocess.CompletedProcess[str]:
    """``diffgemma-engine ARGS`` (after ``prelude``, Python run first in the same process)."""
    code = f"{prelude}\nfrom diffgemma_engine.__main__ import main\nmain({list(args)!r})"
    return subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300, check=False
    )


def _pull(env: dict[str, str], prelude: str = "") -> subprocess.CompletedProcess[str]:
    return _engine("pull", RELEASE_ID, env=env, prelude=prelude)


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_pull_then_infill_and_serve_by_id_with_no_network(
    hub: StandInHub, hub_env: dict[str, str], release_random_dir: Path, short_tmp: Path
) -> None:
    pulled = _pull(hub_env)
    assert pulled.returncode == 0, pulled.stderr
    folder = Path(pulled.stdout.strip())
    assert folder.is_relative_to(short_tmp / "hf" / "hub")  # huggingface_hub's usual cache, under HF_HOME
    shards = json.loads((release_random_dir / "model.safetensors.index.json").read_text())["weight_map"].values()
    for name in set(shards):
        assert _digest(folder / name) == _digest(release_random_dir / name), name
    assert "processor_config.json" not in hub.fetched()  # only what loading needs
    assert not (folder / "processor_config.json").exists()
    assert "Fetching" in pulled.stderr  # huggingface_hub's progress, on the terminal's stderr

    offline = {**hub_env, "HF_HUB_OFFLINE": "1"}
    asked = len(hub.requests)
    answer = _engine("infill", "--model", RELEASE_ID, "--steps", "2", "--canvas-length", "16", env=offline)
    assert answer.returncode == 0, answer.stderr
    assert answer.stdout.strip()
    assert f"loaded {folder}" in answer.stderr
    assert len(hub.requests) == asked  # offline: nothing asked of the hub

    os.environ["HF_HUB_OFFLINE"] = "1"  # the engine process inherits it (monkeypatch restores the environment)
    engine = EngineProcess(RELEASE_ID, short_tmp / "run" / "engine.sock", short_tmp / "engine.log")  # type: ignore[arg-type]
    try:
        result = _serve_one(engine.socket_path)
        assert isinstance(result, protocol.Result), result
        assert result.timings.steps > 0
        assert f"loaded {folder}" in engine.log()
        assert _served_model(engine.socket_path) == RELEASE_ID  # named by its id, not by its snapshot's hash
    finally:
        engine.stop()
    assert len(hub.requests) == asked


def _served_model(socket_path: Path) -> str:
    """The ``model_id`` the engine's handshake names."""
    import asyncio

    async def ask() -> str:
        client = await RawClient.connect(socket_path, hello=False)
        try:
            await client.send(protocol.Hello(protocol=protocol.PROTOCOL_VERSION, client="test", pid=os.getpid()))
            reply = await client.receive()
            assert isinstance(reply, protocol.HelloOk), reply
            return reply.model_id
        finally:
            await client.close()

    return asyncio.run(ask())


def _serve_one(socket_path: Path) -> protocol.Message:
    import asyncio

    async def ask() -> protocol.Message:
        client = await RawClient.connect(socket_path)
        try:
            request = protocol.Infill(id="1", uri="file:///a.py", prefix="def f(x):\n", suffix="", max_steps=2)
            await client.send(request)
            return await client.receive(timeout=120)
        finally:
            await client.close()

    return asyncio.run(ask())


def test_an_id_not_cached_while_offline_names_pull(hub: StandInHub, hub_env: dict[str, str]) -> None:
    offline = {**hub_env, "HF_HUB_OFFLINE": "1"}
    answer = _engine("infill", "--model", RELEASE_ID, env=offline)
    assert answer.returncode == 2
    assert f"diffgemma-engine pull {RELEASE_ID}" in answer.stderr
    assert "HF_HUB_OFFLINE=1" in answer.stderr
    assert hub.requests == []


def test_plan_of_an_id_fetches_its_config_alone(hub: StandInHub, hub_env: dict[str, str]) -> None:
    planned = _engine("plan", "--model", RELEASE_ID, "--max-memory", "cuda:0=24GiB,cpu=64GiB", "--json", env=hub_env)
    assert planned.returncode == 0, planned.stderr
    result = json.loads(planned.stdout)
    assert result["parameters"] > 0 and result["recommendation"]
    assert set(hub.fetched("GET")) == {"config.json"}
    assert not [name for name in hub.fetched("HEAD") if name != "config.json"]
    assert "0 of ? weight files whole" in planned.stderr and "the weights are not downloaded" in planned.stderr
    assert f"`diffgemma-engine pull {RELEASE_ID}` fetches the rest" in planned.stderr


SMALL_CHUNKS = "import huggingface_hub.constants as constants\nconstants.DOWNLOAD_CHUNK_SIZE = 65536"
"""The release's shards are GBs, downloaded in 10 MiB chunks; the test checkpoint's are 300 KB: chunks of 64 KiB
let a dropped connection resume part-way through one."""


def test_a_dropped_connection_resumes_where_it_stopped(
    hub: StandInHub, hub_env: dict[str, str], release_random_dir: Path
) -> None:
    hub.cut_once[SHARD] = 200_000
    pulled = _pull(hub_env, prelude=SMALL_CHUNKS)
    assert pulled.returncode == 0, pulled.stderr
    ranges = [r.range for r in hub.requests if r.method == "GET" and r.file == SHARD]
    assert ranges == [None, "bytes=196608-"]  # three whole chunks kept, the rest asked for
    assert _digest(Path(pulled.stdout.strip()) / SHARD) == _digest(release_random_dir / SHARD)


def test_an_interrupted_pull_fetches_only_what_is_missing_when_run_again(
    hub: StandInHub, hub_env: dict[str, str]
) -> None:
    hub.refuse.add(SHARD)
    failed = _pull(hub_env)
    assert failed.returncode == 2
    assert f"cannot fetch {RELEASE_ID}" in failed.stderr
    first = set(hub.fetched("GET")) - {SHARD}

    offline = {**hub_env, "HF_HUB_OFFLINE": "1"}
    refused = _engine("infill", "--model", RELEASE_ID, env=offline)  # half a snapshot is not loaded
    assert refused.returncode == 2
    assert f"diffgemma-engine pull {RELEASE_ID}" in refused.stderr

    assert "5 of 6 weight files whole" in _doctor(hub_env)["hub_cache"]  # how far the pull got
    assert f"{SHARD} is missing" in _doctor(hub_env)["hub_cache"]

    hub.refuse.clear()
    hub.requests.clear()
    pulled = _pull(hub_env)
    assert pulled.returncode == 0, pulled.stderr
    again = set(hub.fetched("GET"))
    assert SHARD in again
    assert not again & {name for name in first if name.endswith(".safetensors")}  # whole shards are kept
    assert _doctor(hub_env)["hub_cache"] == f"{RELEASE_ID}: every weight file whole in {pulled.stdout.strip()}"


def _doctor(env: dict[str, str]) -> dict[str, str]:
    """``diffgemma-lsp doctor --model ID --json`` with no engine running."""
    done = subprocess.run(
        [sys.executable, "-m", "diffgemma_lsp", "doctor", "--model", RELEASE_ID, "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2, done.stderr  # no engine: unreachable
    report: dict[str, str] = json.loads(done.stdout)
    return report


def test_the_cache_look_loads_no_torch() -> None:
    """``doctor`` (which never imports torch) reads the hub cache through ``diffgemma_engine.loading.hub``."""
    code = (
        "import sys\nfrom diffgemma_engine.loading.hub import cache_state\ncache_state('a/b').summary()\n"
        "assert 'torch' not in sys.modules and 'transformers' not in sys.modules, "
        "'diffgemma_engine.loading.hub loads torch'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_doctor_names_an_id_that_is_not_pulled(hub: StandInHub, hub_env: dict[str, str]) -> None:
    assert "not in the hub cache" in _doctor(hub_env)["hub_cache"]
    assert f"diffgemma-engine pull {RELEASE_ID}" in _doctor(hub_env)["hub_cache"]
    assert hub.requests == []  # doctor reads the cache alone


def test_pull_refuses_what_is_not_a_hub_id(hub_env: dict[str, str]) -> None:
    answer = _engine("pull", "/some/folder", env=hub_env)
    assert answer.returncode == 2
    assert "not a hub id (owner/name" in answer.stderr


def test_the_patterns_cover_every_file_the_loader_reads(release_random_dir: Path) -> None:
    """What ``pull`` leaves out of the release-format folder is what the engine never opens."""
    from fnmatch import fnmatch

    left_out = {p.name for p in release_random_dir.iterdir() if not any(fnmatch(p.name, x) for x in LOAD_PATTERNS)}
    assert left_out == {"processor_config.json"}


@pytest.fixture
def unreachable_env(hub_env: dict[str, str]) -> dict[str, str]:
    """The test's environment with a hub that cannot be reached (a port nothing listens on)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return {**hub_env, "HF_ENDPOINT": f"http://127.0.0.1:{port}"}


def test_pull_with_the_hub_out_of_reach_says_so_and_not_to_run_pull(unreachable_env: dict[str, str]) -> None:
    answer = _pull(unreachable_env)
    assert answer.returncode == 2
    assert "cannot be reached: check the network (or HF_ENDPOINT)" in answer.stderr, answer.stderr
    assert "diffgemma-engine pull" not in answer.stderr


def test_plan_of_an_id_with_the_hub_out_of_reach_refuses_at_once_and_once(unreachable_env: dict[str, str]) -> None:
    """huggingface_hub retries a file it has not cached five times with backoff (24 s), each warning printed by its
    own handler and again by the engine's: one look tells it the hub is out of reach, and nothing is retried."""
    planned = _engine("plan", "--model", RELEASE_ID, env=unreachable_env)
    assert planned.returncode == 2
    assert "Retrying" not in planned.stderr, planned.stderr
    assert planned.stderr.count("cannot be reached") == 1, planned.stderr
    assert f"diffgemma-engine pull {RELEASE_ID}" in planned.stderr
