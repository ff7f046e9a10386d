"""Issue 44: ``serve``'s options are one attrs class on both sides of the process boundary. The language server's
engine launcher writes a ``ServeOptions`` as a command line (``ServeOptions.argv``), the engine's own parser reads it
back into the same options, and the choices the settings offer are the engine's."""

from __future__ import annotations

from pathlib import Path

import pytest

from diffgemma_engine.__main__ import build_parser
from diffgemma_engine.serve_command import options_of, step_mode_of
from diffgemma_engine.shared.serve_options import RUNTIMES, STEP_MODES, Runtime, ServeOptions
from diffgemma_lsp import settings as lsp_settings
from diffgemma_lsp.backends.connect import EngineSettings, engine_command

SOCKET = Path("/run/user/1000/diffgemma/engine-abc.sock")

EVERY_OPTION = ServeOptions(
    engine_socket=SOCKET,
    model="google/diffusiongemma-26B-A4B-it",
    device="cuda:0,1",
    dtype="bfloat16",
    quantization="int8",
    max_memory="cuda:0=20GiB,cpu=48GiB",
    threads=3,
    max_pending=9,
    max_batch=1,
    step="compiled",
    idle_exit=2.5,
    exist_ok=True,
    runtime=Runtime.VLLM,
    vllm_command="/opt/vllm/bin/vllm",
    vllm_socket=Path("/run/vllm.sock"),
    vllm_url="https://gpu:8000",
    vllm_plain_http=True,
    vllm_model="dg",
)


def _read_back(argv: list[str]) -> ServeOptions:
    parser = build_parser()
    return options_of(parser.parse_args(argv), parser)


@pytest.fixture(autouse=True)
def _no_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("DIFFGEMMA_STEP", "DIFFGEMMA_RUNTIME", "DIFFGEMMA_VLLM_API_KEY", "DIFFGEMMA_COMPILE"):
        monkeypatch.delenv(name, raising=False)


@pytest.mark.parametrize(
    "options",
    [
        ServeOptions(engine_socket=SOCKET),
        EVERY_OPTION,
        ServeOptions(engine_socket=SOCKET, idle_exit=None),
        ServeOptions(engine_socket=SOCKET, idle_exit=1800.0),
        *[ServeOptions(engine_socket=SOCKET, runtime=Runtime(runtime)) for runtime in RUNTIMES],
        *[ServeOptions(engine_socket=SOCKET, step=step) for step in STEP_MODES],
    ],
)
def test_the_engine_reads_back_the_options_written(options: ServeOptions) -> None:
    assert options.argv()[0] == "serve"
    assert _read_back(options.argv()) == options


def test_every_option_is_written() -> None:
    """An option ``argv`` left out would come back as its default: the class's fields are all on the command line
    (the key alone is not: it comes from the environment, never a process listing)."""
    default = ServeOptions(engine_socket=Path("/elsewhere.sock"))
    for field in ServeOptions.__attrs_attrs__:
        if field.name != "api_key":
            assert getattr(EVERY_OPTION, field.name) != getattr(default, field.name), field.name
    assert "api_key" not in repr(ServeOptions(engine_socket=SOCKET, api_key="secret"))
    assert "secret" not in ServeOptions(engine_socket=SOCKET, api_key="secret").argv()


def test_the_language_servers_launcher_writes_options_the_engine_reads(tmp_path: Path) -> None:
    engine = EngineSettings(
        model="google/diffusiongemma-26B-A4B-it",
        device="cuda:0",
        quantization="int8",
        idle_exit_minutes=30,
        runtime="transformers",
        step_mode="captured",
    )
    command = engine_command(SOCKET, engine, tmp_path / "engine.log")
    assert command[1:5] == ["-m", "diffgemma_engine", "--log-file", str(tmp_path / "engine.log")]
    read = _read_back(command[5:])
    assert read == engine.serve_options(SOCKET)
    assert (read.runtime, read.step, read.idle_exit, read.quantization) == (
        Runtime.TRANSFORMERS,
        "captured",
        1800.0,
        "int8",
    )
    assert read.exist_ok  # a second window's engine leaves the first one serving


def test_the_settings_offer_the_engines_choices() -> None:
    parser = build_parser()
    serve = next(action for action in parser._subparsers._group_actions if action.dest == "command")  # type: ignore[union-attr]
    runtime = next(action for action in serve.choices["serve"]._actions if action.dest == "runtime")
    assert tuple(runtime.choices) == lsp_settings.RUNTIMES == tuple(choice.value for choice in Runtime)
    for step in lsp_settings.STEP_MODES:
        assert step_mode_of(parser.parse_args(["serve", "--step", step]), parser) == step
    with pytest.raises(SystemExit):
        step_mode_of(parser.parse_args(["serve", "--step", "turbo"]), parser)
    assert set(lsp_settings.STEP_MODES) == set(STEP_MODES)
