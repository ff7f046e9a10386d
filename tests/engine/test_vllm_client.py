"""Issue 27: the engine's vLLM client (``diffgemma_engine.vllm.client``) against a server that parses and validates
every request with vLLM 0.33's own code and answers with vLLM's own response classes (tests/support/
vllm_standin.py: the one stand-in, for vLLM's GPU execution): health and version, a completion and a rewrite read
back, vLLM's refusal passed on with its message, a cancel that aborts the request in the server, and a socket in a
directory others can write refused before anything is sent."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from diffgemma_engine.loading.checkpoint_files import DEFAULT_MODEL_DIR
from diffgemma_engine.loading.model import LoadedModel, load_model
from diffgemma_engine.request.canvas_ask import canvas_ask
from diffgemma_engine.request.on_vllm import run_on_vllm
from diffgemma_engine.shared import protocol
from diffgemma_engine.vllm.client import VllmError, VllmServer, wait_until_healthy
from diffgemma_engine.vllm.completions import CACHED_UNREPORTED, STEPS_UNREPORTED, completion_body, read_reply

STANDIN = Path(__file__).resolve().parents[1] / "support" / "vllm_standin.py"


@pytest.fixture(scope="module")
def shipped() -> LoadedModel:
    return load_model(None)


@pytest.fixture(scope="module")
def standin(vllm_python: Path, shipped: LoadedModel) -> Iterator[tuple[VllmServer, Path]]:
    folder = Path(tempfile.mkdtemp(prefix="vllm-", dir="/tmp"))
    os.chmod(folder, 0o700)
    log = folder / "requests.jsonl"
    command = [str(vllm_python), str(STANDIN), "--socket", str(folder / "vllm.sock"), "--log", str(log)]
    command += ["--model", str(DEFAULT_MODEL_DIR), "--canvas", str(shipped.canvas_length), "--answer-ids", "5,6,1"]
    process = subprocess.Popen(command, stderr=subprocess.PIPE, text=True)
    server = VllmServer(socket_path=folder / "vllm.sock")
    alive = lambda: process.poll() is None  # noqa: E731
    assert wait_until_healthy(server, 300, alive), process.stderr.read() if process.stderr else ""
    yield server, log
    process.kill()
    process.wait()


def _requests(log: Path) -> list[dict]:
    """The requests the server answered, refused or dropped (not the notes of their arrival)."""
    return [entry for line in log.read_text().splitlines() if "ok" in (entry := json.loads(line))]


def _infill(**fields: object) -> protocol.Infill:
    values: dict[str, object] = {"id": "1", "uri": "file:///a.py", "prefix": "def add(a, b):\n    ", "seed": 3}
    values.update(fields)
    return protocol.Infill(**values)  # type: ignore[arg-type]


def test_health_version_and_a_completion(standin: tuple[VllmServer, Path], shipped: LoadedModel) -> None:
    server, log = standin
    assert server.healthy() and server.version() == "0.33.0"
    ask, _ = canvas_ask(shipped, _infill(candidates=2))
    body = completion_body(ask, model="default", served_canvas=shipped.canvas_length)
    reply, stopped = server.complete(body)
    assert stopped is None
    answer = read_reply(reply, candidates=2)
    assert [choice.token_ids for choice in answer.choices] == [[5, 6, 1], [5, 6, 1]]
    assert answer.prompt_tokens == len(ask.prompt_ids)
    assert _requests(log)[-1]["ok"] is True


def test_the_steps_vllm_ran_are_unknown_and_teach_the_step_clock_nothing(
    standin: tuple[VllmServer, Path], shipped: LoadedModel
) -> None:
    """Issue 41: vLLM stops a settled canvas early and its reply does not say when, so the step budget sent is not
    recorded as the steps run (the clock would learn a time per step several times too small); a server without
    ``--enable-prompt-tokens-details`` (this one) reports no cached share, which is said, not shown as 0."""
    server, _ = standin
    clock = shipped.serving.clock
    clock.step_ms.clear()
    notes: set[str] = set()
    (answer,) = run_on_vllm(shipped, _infill(), server, "default", notes=notes)
    assert answer.stop is protocol.StopReason.EOS and answer.timings.prompt_tokens > 0
    assert answer.timings.steps == 0 and clock.step_ms == {}
    assert notes == {STEPS_UNREPORTED, CACHED_UNREPORTED}


def test_a_rewrite_reaches_vllm_as_its_seed_canvas(standin: tuple[VllmServer, Path], shipped: LoadedModel) -> None:
    server, log = standin
    ask, laid = canvas_ask(shipped, _infill(start=[protocol.StartSegment(text="return a + b\n", keep=True)]))
    reply, _ = server.complete(completion_body(ask, model="default", served_canvas=shipped.canvas_length))
    (choice,) = read_reply(reply, candidates=1).choices
    assert choice.token_ids == ask.start_ids and laid.row is not None
    assert _requests(log)[-1]["extra_args"]["diffusion_pinned"] == ask.held != []


def test_vllms_refusal_comes_back_with_its_message(standin: tuple[VllmServer, Path], shipped: LoadedModel) -> None:
    server, _ = standin
    ask, _ = canvas_ask(shipped, _infill())
    body = completion_body(ask, model="default", served_canvas=shipped.canvas_length)
    body["vllm_xargs"]["diffusion_canvas_length"] = shipped.canvas_length + 1  # wider than served
    with pytest.raises(VllmError, match="diffusion_canvas_length must be a positive integer no larger"):
        server.complete(body)


def test_a_cancel_aborts_the_request_in_vllm(standin: tuple[VllmServer, Path], shipped: LoadedModel) -> None:
    server, log = standin
    server.request("POST", "/standin/delay", {"delay_s": 30})
    try:
        ask, _ = canvas_ask(shipped, _infill())
        body = completion_body(ask, model="default", served_canvas=shipped.canvas_length)
        started = time.monotonic()
        stop = lambda: "cancelled" if time.monotonic() - started > 0.5 else None  # noqa: E731
        reply, stopped = server.complete(body, should_stop=stop)
        assert (reply, stopped) == (None, "cancelled") and time.monotonic() - started < 10
        deadline = time.monotonic() + 10
        while not _requests(log)[-1].get("aborted") and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _requests(log)[-1]["aborted"] is True  # the server saw its client go and dropped the request
    finally:
        server.request("POST", "/standin/delay", {"delay_s": 0})


def test_a_socket_others_can_reach_is_refused_before_anything_is_sent(tmp_path: Path) -> None:
    folder = tmp_path / "open"
    folder.mkdir()
    os.chmod(folder, 0o777)
    with pytest.raises(VllmError, match="can be written by others"):
        VllmServer(socket_path=folder / "vllm.sock").complete({"prompt": [1]})
    assert not VllmServer(socket_path=folder / "vllm.sock").healthy()
    assert sys.platform.startswith("linux")


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        ([], "no `vllm` on PATH"),
        (["--vllm-socket", "/tmp/a.sock", "--vllm-url", "http://127.0.0.1:8000"], "give one"),
        (["--vllm-url", "http://127.0.0.1:8000", "--quantization", "int8"], "--quantization: options of the engine's"),
    ],
    ids=["no-vllm", "two-servers", "own-loop-option"],
)
def test_serve_runtime_vllm_refuses_what_cannot_run(
    flags: list[str], said: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The command line's refusals (``diffgemma_engine.service.runtime_choice``): exit 2, saying what to mend."""
    from diffgemma_engine.__main__ import main

    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(SystemExit) as exited:
        main(["serve", "--runtime", "vllm", "--socket", str(tmp_path / "e.sock"), *flags])
    assert exited.value.code == 2
    assert said in capsys.readouterr().err
