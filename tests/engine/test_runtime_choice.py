"""Issue 27: what runs the canvases (``diffgemma_engine.service.runtime_choice``): ``--runtime auto`` picks vLLM
only where there is a CUDA device, a ``vllm`` to run and no option of the engine's own loop; ``--runtime vllm``
refuses the own loop's options rather than ignoring them; ``--device`` becomes the GPUs vLLM is given."""

from __future__ import annotations

import re
from pathlib import Path
from unittest.mock import patch

import pytest

from diffgemma_engine.service.runtime_choice import (
    Runtime,
    RuntimeRefused,
    ServeOptions,
    choose_runtime,
    vllm_socket_beside,
)


@pytest.fixture
def vllm_on_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An executable ``vllm`` on PATH (never run here: the choice only looks for it)."""
    folder = tmp_path / "bin"
    folder.mkdir()
    executable = folder / "vllm"
    executable.write_text("#!/bin/sh\nexit 0\n")
    executable.chmod(0o755)
    monkeypatch.setenv("PATH", str(folder))
    return executable


def _options(**fields: object) -> ServeOptions:
    return ServeOptions(engine_socket=Path("/run/dg/engine-abc.sock"), **fields)  # type: ignore[arg-type]


def test_auto_picks_vllm_where_a_gpu_and_vllm_are(vllm_on_path: Path) -> None:
    choice = choose_runtime(_options(), cuda_count=lambda: 1)
    assert choice.vllm is not None and choice.vllm.executable == vllm_on_path.resolve()
    assert choice.vllm.server.socket_path == Path("/run/dg/engine-abc.vllm.sock")
    assert (choice.vllm.visible_devices, choice.vllm.tensor_parallel) == ("", 1)


@pytest.mark.parametrize(
    ("fields", "gpus", "why"),
    [
        ({}, 0, "no CUDA device"),
        ({"quantization": "int8"}, 1, "--quantization asks for the engine's own loop"),
        ({"step": "captured"}, 1, "--step asks for the engine's own loop"),
        ({"device": "cpu"}, 1, "--device cpu is not CUDA only"),
        ({"device": "cuda:0,cpu"}, 1, "--device cuda:0,cpu is not CUDA only"),
    ],
)
def test_auto_keeps_the_own_loop_and_says_why(
    vllm_on_path: Path, fields: dict[str, object], gpus: int, why: str
) -> None:
    choice = choose_runtime(_options(**fields), cuda_count=lambda: gpus)
    assert choice.vllm is None and why in choice.reason


def test_auto_without_vllm_is_the_own_loop(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    choice = choose_runtime(_options(), cuda_count=lambda: 8)
    assert choice.vllm is None and "no `vllm` on PATH" in choice.reason
    assert choose_runtime(_options(runtime=Runtime.TRANSFORMERS), cuda_count=lambda: 8).vllm is None


def test_a_socket_or_url_attaches(tmp_path: Path) -> None:
    choice = choose_runtime(_options(vllm_url="https://gpu:8000", api_key="k", vllm_model="dg"), cuda_count=lambda: 0)
    assert choice.vllm is not None and choice.vllm.executable is None
    server = choice.vllm.server
    assert (server.url, server.api_key, choice.vllm.model_name) == ("https://gpu:8000", "k", "dg")
    socket_choice = choose_runtime(_options(runtime=Runtime.VLLM, vllm_socket=tmp_path / "v.sock"))
    assert socket_choice.vllm is not None and socket_choice.vllm.server.socket_path == tmp_path / "v.sock"


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"quantization": "int8"}, "--quantization: options of the engine's own loop"),
        ({"dtype": "float16", "max_memory": "cuda:0=20GiB"}, "--dtype, --max-memory: options of the engine's own"),
        ({"device": "cpu"}, "vLLM runs on GPUs only"),
        ({"device": "cuda:2"}, "there is no cuda:2 here"),
        ({"vllm_socket": Path("/s"), "device": "cuda:0"}, "for a vLLM the engine starts"),
        ({"vllm_socket": Path("/s"), "vllm_url": "http://x"}, "give one"),
    ],
)
def test_vllm_refuses_what_it_would_ignore(vllm_on_path: Path, fields: dict[str, object], message: str) -> None:
    with pytest.raises(RuntimeRefused, match=message):
        choose_runtime(_options(runtime=Runtime.VLLM, **fields), cuda_count=lambda: 2)


def test_the_own_loop_refuses_the_vllm_options() -> None:
    with pytest.raises(RuntimeRefused, match="are for --runtime vllm"):
        choose_runtime(_options(runtime=Runtime.TRANSFORMERS, vllm_url="http://gpu:8000"))


def test_vllm_needs_a_vllm_to_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(RuntimeRefused, match="no `vllm` on PATH"):
        choose_runtime(_options(runtime=Runtime.VLLM), cuda_count=lambda: 1)
    not_executable = tmp_path / "vllm"
    not_executable.write_text("")
    with pytest.raises(RuntimeRefused, match="not an executable file"):
        choose_runtime(_options(runtime=Runtime.VLLM, vllm_command=str(not_executable)), cuda_count=lambda: 1)


def test_the_devices_become_vllms_gpus(vllm_on_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    two = choose_runtime(_options(runtime=Runtime.VLLM, device="cuda:0,1"), cuda_count=lambda: 2).vllm
    assert two is not None and (two.visible_devices, two.tensor_parallel) == ("0,1", 2)
    one = choose_runtime(_options(runtime=Runtime.VLLM, device="cuda:1"), cuda_count=lambda: 2).vllm
    assert one is not None and (one.visible_devices, one.tensor_parallel) == ("1", 1)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,6")  # the engine's own cuda:1 is the machine's GPU 6
    given = choose_runtime(_options(runtime=Runtime.VLLM, device="cuda:1"), cuda_count=lambda: 2).vllm
    assert given is not None and given.visible_devices == "6"


def test_vllms_socket_is_beside_the_engines() -> None:
    assert vllm_socket_beside(Path("/run/d/engine.sock")) == Path("/run/d/engine.vllm.sock")


def test_the_readmes_vllm_commands_run_vllm_on_their_machines(vllm_on_path: Path) -> None:
    """Each NVIDIA row of the README's vLLM table: its command, read by the engine's own parser, picks vLLM on that
    machine's GPUs (tensor parallelism across both cards of the two-card row)."""
    from benchmarks.machine_table import MACHINES
    from diffgemma_engine.__main__ import build_parser, runtime_of

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    section = readme.split("### On NVIDIA cards: vLLM", 1)[1].split("\n## ", 1)[0]
    gpus = {machine["machine"]: machine["max_memory"].count("cuda:") for machine in MACHINES}
    checked = 0
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) != 4 or cells[0] not in gpus:
            continue
        command = re.fullmatch(r"`diffgemma-engine (serve .*)`", cells[2])
        assert command is not None, cells
        parser = build_parser()
        args = parser.parse_args([*command.group(1).split(), "--socket", "/run/dg/engine.sock"])
        count = gpus[cells[0]]
        with patch("diffgemma_engine.service.runtime_choice.cuda_device_count", lambda count=count: count):
            choice = runtime_of(args, parser)
        assert choice.vllm is not None and choice.vllm.executable == vllm_on_path.resolve(), cells[0]
        assert choice.vllm.tensor_parallel == count, cells[0]
        checked += 1
    assert checked == 4
