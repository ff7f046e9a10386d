"""A hostile model folder is refused, naming the file or key, before it costs minutes or gigabytes: files over
their caps (sparse files: no disk used), a config whose sizes would build for minutes even on the meta device,
and chat templates that loop for ever or allocate gigabytes (rendered in a limited child process)."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from diffgemma_engine.errors import ModelLoadError
from diffgemma_engine.loading.folder_limits import FILE_CAPS
from diffgemma_engine.loading.model import load_model
from diffgemma_engine.loading.plan import read_spec
from diffgemma_engine.shared.prompt import layout_for
from diffgemma_engine.shared.template_render import TemplateLimitError
from tests.conftest import ROOT


def _copy(source: Path, tmp_path: Path) -> Path:
    folder = tmp_path / "model"
    shutil.copytree(source, folder)
    return folder


def _edit_config(folder: Path, section: str | None, key: str, value: object) -> None:
    config = json.loads((folder / "config.json").read_text())
    (config[section] if section else config)[key] = value
    (folder / "config.json").write_text(json.dumps(config))


# -- files over their caps -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "size"),
    [
        ("tokenizer_config.json", 2 << 30),  # the red team's: 2 GiB, read whole before
        ("tokenizer.json", FILE_CAPS["tokenizer.json"] + 1),
        ("chat_template.jinja", FILE_CAPS["chat_template.jinja"] + 1),
        ("special_tokens_map.json", FILE_CAPS["special_tokens_map.json"] + 1),
        ("added_tokens.json", FILE_CAPS["added_tokens.json"] + 1),
        ("model.safetensors.index.json", FILE_CAPS["model.safetensors.index.json"] + 1),
        ("some_other_settings.json", 33 << 20),
    ],
)
def test_a_file_over_its_cap_is_refused_before_it_is_read(
    tmp_path: Path, release_random_dir: Path, name: str, size: int
) -> None:
    folder = _copy(release_random_dir, tmp_path)
    with (folder / name).open("wb") as handle:
        handle.truncate(size)  # sparse: the size without the disk
    with pytest.raises(ModelLoadError, match=f"{name} is {size} bytes"):
        load_model(folder)
    with pytest.raises(ModelLoadError, match=f"{name} is {size} bytes"):
        read_spec(folder)
    print(f"hostile folders: {name} of {size} bytes refused by load and plan")


def test_a_file_that_is_not_a_regular_file_is_refused(tmp_path: Path, release_random_dir: Path) -> None:
    """A pipe (or ``/dev/zero`` behind a symlink) never ends: it is refused, not read."""
    folder = _copy(release_random_dir, tmp_path)
    (folder / "tokenizer_config.json").unlink()
    os.mkfifo(folder / "tokenizer_config.json")
    with pytest.raises(ModelLoadError, match="tokenizer_config.json is not a regular file"):
        load_model(folder)


# -- config sizes -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("section", "key", "value"),
    [
        ("text_config", "num_hidden_layers", 20_000),  # the red team's: plan still building at 75 s, 2.3 GB
        ("text_config", "vocab_size", 1 << 40),
        ("text_config", "num_experts", 1_000_000),
        ("text_config", "hidden_size", -1),
        ("text_config", "num_attention_heads", "16"),
        ("vision_config", "num_hidden_layers", 20_000),
        (None, "canvas_length", 100_000),
    ],
)
def test_a_config_past_the_bounds_is_refused_naming_the_key(
    tmp_path: Path, release_random_dir: Path, section: str | None, key: str, value: object
) -> None:
    folder = _copy(release_random_dir, tmp_path)
    _edit_config(folder, section, key, value)
    where = f"{section}.{key}" if section else key
    with pytest.raises(ModelLoadError, match=where.replace(".", r"\.")):
        read_spec(folder)
    with pytest.raises(ModelLoadError, match=where.replace(".", r"\.")):
        load_model(folder)
    print(f"hostile folders: config {where} = {value!r} refused by plan and load")


def test_plan_refuses_20000_layers_with_a_clear_line(tmp_path: Path) -> None:
    """The command meant to check a folder before loading it answers in seconds, with no traceback."""
    (tmp_path / "config.json").write_text(
        (ROOT / "tests" / "data" / "release" / "config.json")
        .read_text()
        .replace('"num_hidden_layers": 30', '"num_hidden_layers": 20000')
    )
    out = subprocess.run(
        [sys.executable, "-m", "diffgemma_engine", "plan", "--model", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert out.returncode == 2, out.stderr
    assert "text_config.num_hidden_layers must be a whole number from 1 to 512, got 20000" in out.stderr
    assert "Traceback" not in out.stderr


# -- chat templates -----------------------------------------------------------------------------------------------

HOSTILE_TEMPLATES = {
    "nested loops": "{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}",
    "3 GB string": "{{ 'x' * 3000000000 }}",
    "doubling": "{% set ns = namespace(s='x') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
    "huge output": "{% for i in range(1000) %}{{ 'x' * 1000 }}{% endfor %}{{ messages[0]['content'] }}",
    "an error": "{{ raise_exception('no') }}",
}


@pytest.mark.parametrize("case", sorted(HOSTILE_TEMPLATES))
def test_a_hostile_chat_template_is_refused_with_its_limit(release_random_dir: Path, case: str) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(release_random_dir, local_files_only=True)
    tokenizer.chat_template = HOSTILE_TEMPLATES[case]
    with pytest.raises(TemplateLimitError, match="chat template") as refused:
        layout_for(tokenizer)
    print(f"hostile folders: chat template with {case} refused: {refused.value}")


def test_a_hostile_chat_template_fails_the_load(tmp_path: Path, release_random_dir: Path) -> None:
    folder = _copy(release_random_dir, tmp_path)
    (folder / "chat_template.jinja").write_text(HOSTILE_TEMPLATES["3 GB string"])
    with pytest.raises(ModelLoadError, match="cannot lay out prompts .* chat template needs more than"):
        load_model(folder)


def test_the_release_template_renders_as_transformers_renders_it(release_random_dir: Path) -> None:
    """The limited renderer is transformers' own: the release-format template gives what apply_chat_template gives."""
    from transformers import AutoTokenizer

    from diffgemma_engine.shared.prompt import USER_SLOT, chat_template_of

    tokenizer = AutoTokenizer.from_pretrained(release_random_dir, local_files_only=True)
    template = chat_template_of(tokenizer)
    expected = tokenizer.apply_chat_template(
        [{"role": "user", "content": USER_SLOT}], add_generation_prompt=True, tokenize=False, enable_thinking=False
    )
    head, _, tail = str(expected).partition(USER_SLOT)
    assert template.head == tuple(tokenizer.encode(head, add_special_tokens=False))
    assert template.tail == tuple(tokenizer.encode(tail, add_special_tokens=False))


# -- the model's own settings -------------------------------------------------------------------------------------


@pytest.mark.e2e
def test_a_step_count_past_the_engines_cap_is_a_failed_load_the_client_is_told(
    short_tmp: Path, release_random_dir: Path
) -> None:
    """``max_denoising_steps: 1000000`` loaded as ready, then every completion was refused with no word to the user:
    now the engine reports a failed load naming the key, and the language server's doctor shows it."""
    from tests.e2e.test_release_format import doctor
    from tests.support.engine import EngineProcess

    folder = short_tmp / "model"
    shutil.copytree(release_random_dir, folder)
    generation = json.loads((folder / "generation_config.json").read_text())
    generation["max_denoising_steps"] = 1_000_000
    (folder / "generation_config.json").write_text(json.dumps(generation))
    process = EngineProcess(folder, short_tmp / "engine.sock", short_tmp / "engine.log")
    try:
        status, report = doctor(process.socket_path, "--model", str(folder))
    finally:
        process.stop()
    assert status == 1, report
    problem = str(report["problem"])
    assert "model failed to load" in problem and "max_denoising_steps must be a whole number from 1 to 256" in problem
    print(f"hostile folders: max_denoising_steps 1000000 reported as: {problem}")


async def test_a_load_that_fails_at_once_waits_for_a_client_to_hear_why(short_tmp: Path) -> None:
    """A folder with no weights fails in milliseconds, before the language server that started the engine has
    connected: the engine used to stop at once, and the user read a traceback ("the engine exited with status 1")
    instead of the reason. Now it waits for a client to hear the reason, then stops."""
    import asyncio
    import time

    from diffgemma_engine.service.server import LOAD_ERROR_LINGER_S
    from diffgemma_engine.shared import protocol
    from tests.support.engine import EngineProcess, RawClient

    folder = short_tmp / "no-weights"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    process = EngineProcess(folder, short_tmp / "engine.sock", short_tmp / "engine.log")
    try:
        await asyncio.sleep(2.0)  # the load has failed by now (it is logged), and no one has connected
        assert "model load failed" in process.log()
        assert process.process.poll() is None, "the engine stopped before anyone heard why"
        client = await RawClient.connect(process.socket_path, hello=False)
        await client.send(protocol.Hello(protocol=protocol.PROTOCOL_VERSION, client="test", pid=os.getpid()))
        reply = await client.receive()
        assert isinstance(reply, protocol.Error) and reply.code is protocol.ErrorCode.MODEL_ERROR, reply
        assert "model failed to load" in reply.message and "no weights" in reply.message, reply.message
        await client.close()
        heard = time.monotonic()
        assert process.process.wait(LOAD_ERROR_LINGER_S) == 1  # a failed load's status, once heard: no linger
        print(f"failed load: heard, then the engine stopped {time.monotonic() - heard:.2f} s later")
    finally:
        process.stop()


# -- the command line's refusals ----------------------------------------------------------------------------------


def _engine_command(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "diffgemma_engine", *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
        stdin=subprocess.DEVNULL,
    )


def _assert_clear_refusal(out: subprocess.CompletedProcess[str], words: str) -> None:
    from diffgemma_engine.errors import SERVER_PATHS

    assert out.returncode == 2, out.stderr
    assert words in out.stderr, out.stderr
    assert "Traceback" not in out.stderr and not any(path in out.stderr for path in SERVER_PATHS), out.stderr
    assert out.stdout == ""


def test_plan_refuses_a_broken_index_without_a_traceback(tmp_path: Path, release_random_dir: Path) -> None:
    folder = _copy(release_random_dir, tmp_path)
    (folder / "model.safetensors.index.json").write_text('{"metadata": {"total_size": "lots"}, "weight_map": {}}')
    out = _engine_command("plan", "--model", str(folder), "--json")
    _assert_clear_refusal(out, "metadata.total_size must be a whole number of bytes, got 'lots'")
    print(f"hostile folders: plan on a broken index: {out.stderr.strip()}")


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--seed", str(1 << 64)], "seed must be from"),  # beyond torch.Generator.manual_seed: a traceback before
        (["--prefix", "/nonexistent/prefix.py"], "No such file or directory: '/nonexistent/prefix.py'"),
    ],
)
def test_infill_refuses_bad_arguments_without_a_traceback(args: list[str], words: str) -> None:
    out = _engine_command("infill", "--device", "cpu", *args)
    _assert_clear_refusal(out, words)
    print(f"hostile folders: infill {' '.join(args)}: {out.stderr.strip().splitlines()[-1]}")


def test_a_log_file_that_is_a_folder_is_one_line_and_the_state_folder_is_private(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 42, finding 11: an ``engine.log`` that is a folder showed a raw Python traceback in the editor's popup
    (the engine's error output, quoted by the language server), and ``~/.local/state/diffgemma`` was 0755 (its logs
    hold document text with ``-v``)."""
    from diffgemma_engine.shared import logfile
    from diffgemma_engine.shared.socket_paths import UnsafeSocketError, check_socket_dir
    from diffgemma_lsp.backends import connect

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    (tmp_path / "state" / "diffgemma").mkdir(parents=True, mode=0o755)
    (tmp_path / "state" / "diffgemma").chmod(0o755)
    (tmp_path / "state" / "diffgemma" / "engine.log").mkdir()
    done = subprocess.run(
        [sys.executable, "-m", "diffgemma_engine", "--log-file", str(connect.engine_log_path()), "plan"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines()[-1].startswith("diffgemma-engine: cannot write the log file")
    folder = connect._log_folder()  # where the engine the language server starts would log: not the folder
    assert folder != connect.engine_log_path().parent and (folder / "engine.log").parent == folder
    logfile.private_folder(tmp_path / "state" / "diffgemma")
    assert stat.S_IMODE((tmp_path / "state" / "diffgemma").stat().st_mode) == 0o700
    logfile.private_file_handler(tmp_path / "fresh" / "x.log").close()
    assert stat.S_IMODE((tmp_path / "fresh").stat().st_mode) == 0o700
    if os.getuid() == 0:  # a socket folder of another user's in /tmp: this user cannot remove it
        shared = tmp_path / "shared"
        shared.mkdir(mode=0o700)
        os.chown(shared, 12345, -1)
        with pytest.raises(UnsafeSocketError) as refused:
            check_socket_dir(shared)
        assert "remove it" not in str(refused.value) and "XDG_RUNTIME_DIR" in str(refused.value)
