"""Every machine of the README's table (``benchmarks.machine_table.MACHINES``), simulated (``tests.support.devices``):
``diffgemma-engine plan`` on the release's own config recommends the table's setting, ``load_model`` accepts exactly
that setting, and one infill runs on what it loaded. The refusal before loading names a setting that loads too.

What is real and what is scaled: the plan (and the refusal's advice) is asked of the release's ``config.json``
(``tests/data/release``: 25.8 B parameters, built on the meta device), on the machine's own memory. The load is of
the small release-format checkpoint (``release_random_dir``: the release's format and architecture, a few MB), on
the same machine with each accelerator's memory scaled by the small checkpoint's weights over the release's at the
recommended precision (the memory kept free for a request is the small model's own): the small plan then places
its weights as the release's would be placed (same devices, same verdict; checked), so ``load_model`` runs the
same branch (one accelerator or a spread device map, offload or not, quantized or not) down to
``from_pretrained``, whose arguments the simulation checks before it loads on this CPU.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
from pathlib import Path
from typing import Any

import attrs
import pytest

from benchmarks import machine_table
from diffgemma_engine.__main__ import add_model_args, main
from diffgemma_engine.errors import ModelLoadError
from diffgemma_engine.loading import loadable, plan
from diffgemma_engine.loading.model import TOKENIZER_FILES, load_model
from diffgemma_engine.request.infill import run_infill
from diffgemma_engine.shared import protocol
from tests.support.devices import GIB, GPU, Machine, child_environment, machine_from_max_memory, simulated

ROOT = Path(__file__).resolve().parents[2]
RELEASE = ROOT / "tests" / "data" / "release"
README = ROOT / "README.md"
ROWS = {row["machine"]: row for row in machine_table.MACHINES}


def _machine(row: dict[str, Any]) -> Machine:
    return machine_from_max_memory(row["max_memory"], row.get("capability"))


def _options(setting: str) -> argparse.Namespace:
    """``setting`` read by the engine's own option parser, as ``serve`` would read it."""
    parser = argparse.ArgumentParser()
    add_model_args(parser)
    return parser.parse_args(setting.split())


def _plan_cli(model: Path, capsys: pytest.CaptureFixture[str], *options: str) -> dict[str, Any]:
    """``diffgemma-engine plan --model MODEL --json`` on the simulated machine (the devices it detects)."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as exited:
        main(["plan", "--model", str(model), "--json", *options])
    assert exited.value.code == 0
    result: dict[str, Any] = json.loads(capsys.readouterr().out)
    return result


def _scaled(machine: Machine, real: dict[str, Any], small: plan.ModelSpec, precision: str) -> Machine:
    """``machine`` with each accelerator's memory scaled from the release's weights to the small checkpoint's."""
    small_plan = plan.make_plan(small, [])
    ratio = small_plan.loaded_bytes[precision] / real["loaded_bytes"][precision]
    dtype = plan.activation_dtype(precision)
    real_reserve = real["requests"][dtype]["reserve_bytes"]
    small_reserve = small_plan.requests[dtype].reserve_bytes

    def scale(size: int) -> int:
        return small_reserve + int((size - real_reserve) * ratio)

    gpus = tuple(attrs.evolve(gpu, free=scale(gpu.free), total=scale(gpu.free) + GIB) for gpu in machine.gpus)
    if machine.mps_limit is None:
        return attrs.evolve(machine, gpus=gpus)
    cpu_share = machine.mem_available - machine.mps_limit
    return attrs.evolve(
        machine, gpus=gpus, mps_limit=scale(machine.mps_limit), mem_available=scale(machine.mps_limit) + cpu_share
    )


def _readme_commands() -> dict[str, str | None]:
    """The README's machine table: the ``serve`` options it gives per machine (None: does not fit)."""
    found: dict[str, str | None] = {}
    for line in README.read_text().splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) == 6 and cells[0] in ROWS:
            command = re.fullmatch(r"`diffgemma-engine serve (.*)`", cells[2])
            found[cells[0]] = command.group(1) if command else None
    return found


def _load_and_complete(folder: Path, setting: str, machine: Machine, scratch: Path) -> dict[str, Any]:
    """``load_model`` with ``setting`` on ``machine``, then one short infill; what ``from_pretrained`` was given."""
    options = _options(setting)
    with simulated(machine, scratch) as simulation:
        loaded = load_model(
            folder, options.device, options.dtype, max_memory=options.max_memory, quantization=options.quantization
        )
        request = protocol.Infill(id="m", uri="", prefix="def add(a, b):\n", suffix="\n", canvas_length=16, max_steps=2)
        text, _stop, timings = run_infill(loaded, request)
    assert isinstance(text, str) and timings.steps >= 1
    assert len(simulation.loads) == 1
    if options.quantization:
        assert loaded.quantized is not None and loaded.quantized.method == options.quantization
    return simulation.loads[0]


@pytest.fixture(scope="module")
def small_spec(release_random_dir: Path) -> plan.ModelSpec:
    return plan.read_spec(release_random_dir)


@pytest.mark.parametrize("name", list(ROWS))
def test_each_machine_loads_what_the_plan_recommends(
    name: str, release_random_dir: Path, small_spec: plan.ModelSpec, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    row = ROWS[name]
    machine = _machine(row)
    with simulated(machine, tmp_path):
        real = _plan_cli(RELEASE, capsys)
    chosen = real["recommendation"]
    assert chosen is not None, f"{name}: nothing recommended"
    table = machine_table.machine_row(plan.read_spec(RELEASE), row)
    table_setting = next(p["setting"] for p in table["placements"] if p["precision"] == table["recommended"])
    assert chosen["setting"] == table_setting == _readme_commands()[name]  # the plan, the table, the README agree
    scaled = _scaled(machine, real, small_spec, chosen["precision"])
    with simulated(scaled, tmp_path):
        small = _plan_cli(release_random_dir, capsys, "--quantization", chosen["precision"])
    assert small["recommendation"]["setting"] == chosen["setting"]  # the small checkpoint placed as the release
    where = _load_and_complete(release_random_dir, chosen["setting"], scaled, tmp_path)["device_map"]
    used = {"cpu" if device == "disk" else device for device in where.values()}
    named = set(_options(chosen["setting"]).device.replace("cuda:0,1", "cuda:0,cuda:1").split(","))
    assert used == named, (where, chosen)  # placed over exactly the devices the setting names


@pytest.mark.parametrize("name", list(ROWS))
def test_every_placement_the_plan_gives_a_setting_loads(
    name: str, release_random_dir: Path, small_spec: plan.ModelSpec, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Not only the recommendation: each precision the plan offers a setting for on this machine loads with it,
    and each it withholds says why (int8 on MPS; fp8 without the kernels package, or with offload)."""
    machine = _machine(ROWS[name])
    with simulated(machine, tmp_path):
        real = _plan_cli(RELEASE, capsys)
    for precision, placed in real["placements"].items():
        if placed["setting"] is None:
            assert placed["refused"] or not placed["fits"], (precision, placed)
            continue
        _load_and_complete(
            release_random_dir, placed["setting"], _scaled(machine, real, small_spec, precision), tmp_path
        )


@pytest.fixture(scope="module")
def release_config_with_tokenizer(module_tmp: Path, release_random_dir: Path) -> Path:
    """The release's config with the small checkpoint's tokenizer and a stand-in weight file (one whole safetensors
    file of one byte, so that the folder passes the check that its weights are whole): ``load_model`` gets as far
    as its check before loading, on the release's sizes, and never reads that file."""
    folder = module_tmp / "release-config"
    folder.mkdir()
    for source in [RELEASE / "config.json", RELEASE / "generation_config.json", *release_random_dir.iterdir()]:
        if source.name in ("config.json", "generation_config.json") and source.parent != RELEASE:
            continue
        if source.suffix == ".safetensors" or source.name.endswith(".index.json"):
            continue
        shutil.copy(source, folder / source.name)
    assert any((folder / name).is_file() for name in TOKENIZER_FILES)
    header = json.dumps({"placeholder": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}}).encode()
    (folder / "model.safetensors").write_bytes(len(header).to_bytes(8, "little") + header + b"\0")
    return folder


ONE_ACCELERATOR = {"one 24 GB card (RTX 4090)": "cuda:0", "one 32 GB card (RTX 5090)": "cuda:0"}
ONE_ACCELERATOR |= {"a Mac with 64 GB (M3 Max, MPS)": "mps"}
"""The machines whose accelerator cannot hold the release in bf16: ``--device D`` is refused before loading."""


@pytest.mark.parametrize("name", list(ONE_ACCELERATOR))
def test_the_refusal_before_loading_advises_a_setting_that_loads(
    name: str,
    release_config_with_tokenizer: Path,
    release_random_dir: Path,
    small_spec: plan.ModelSpec,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The trace's finding 2: on a 64 GB Mac the refusal advised int8 on mps, which the loader refused."""
    machine = _machine(ROWS[name])
    with simulated(machine, tmp_path), pytest.raises(ModelLoadError, match="does not fit") as refused:
        load_model(release_config_with_tokenizer, ONE_ACCELERATOR[name])
    advised = re.search(r"; use (--device \S+(?: --\S+ \S+)*) \((\w+):", str(refused.value))
    assert advised is not None, str(refused.value)
    setting, precision = advised.groups()
    with simulated(machine, tmp_path):
        real = _plan_cli(RELEASE, capsys)
    _load_and_complete(release_random_dir, setting, _scaled(machine, real, small_spec, precision), tmp_path)


def test_fp8_is_offered_only_where_it_loads() -> None:
    """fp8 on an H100: refused with the reason and the alternative while the kernels package is missing or its
    kernel cannot be fetched offline; offered once both are there (and still not with offload)."""
    spec = plan.read_spec(RELEASE)
    devices = plan.parse_max_memory("cuda:0=79GiB,cpu=64GiB")
    hopper = {"cuda:0": (9, 0)}
    cases = [
        (loadable.Environment(torchao="0.18.0", kernels=None, capabilities=hopper), "kernels package"),
        (loadable.Environment(torchao="0.18.0", kernels="0.17.2", capabilities=hopper), "kernels 0.17.2 is installed"),
        (loadable.Environment(torchao="0.18.0", kernels="0.18.2", capabilities=hopper), "HF_HUB_OFFLINE=1"),
        (loadable.Environment(torchao="0.18.0", kernels="0.18.2", capabilities={"cuda:0": (8, 6)}), "has 8.6"),
    ]
    for env, reason in cases:
        fp8 = plan.make_plan(spec, devices, precisions=("fp8",), env=env).placements[0]
        assert fp8.setting is None and fp8.refused is not None and reason in fp8.refused, fp8.refused
        assert "int8" in fp8.refused  # the alternative
    ready = loadable.Environment(torchao="0.18.0", kernels="0.18.2", fp8_kernel_cached=True, capabilities=hopper)
    fp8 = plan.make_plan(spec, devices, precisions=("fp8",), env=ready).placements[0]
    assert fp8.setting == "--device cuda:0 --quantization fp8" and fp8.refused is None
    small = plan.parse_max_memory("cuda:0=20GiB,cpu=64GiB")
    offloaded = plan.make_plan(spec, small, precisions=("fp8",), env=ready).placements[0]
    assert offloaded.setting is None and "refuses cpu" in (offloaded.refused or "")


def test_fp8_is_refused_before_any_weight_is_read(release_random_dir: Path, tmp_path: Path) -> None:
    """On a simulated H100 without the kernels package: load_model says why, and what instead, before
    from_pretrained is called."""
    hopper = Machine(gpus=(GPU(free=79 * GIB, total=80 * GIB, capability=(9, 0)),))
    with simulated(hopper, tmp_path) as simulation, pytest.raises(ModelLoadError, match="kernels.*int8"):
        load_model(release_random_dir, "cuda:0", quantization="fp8")
    assert simulation.loads == []


@pytest.mark.parametrize("name", ["one 24 GB card (RTX 4090)", "a Mac with 64 GB (M3 Max, MPS)"])
def test_doctor_plan_advises_a_setting_that_loads(
    name: str,
    release_random_dir: Path,
    small_spec: plan.ModelSpec,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``diffgemma-lsp doctor --plan`` runs the plan in a child process: the machine is simulated there too
    (``tests/support/simulated_site``), and the setting it shows loads."""
    from diffgemma_lsp.doctor import memory_plan

    machine = _machine(ROWS[name])
    for variable, value in child_environment(machine, tmp_path).items():
        monkeypatch.setenv(variable, value)
    shown = memory_plan(str(RELEASE), "auto")
    assert "error" not in shown, shown
    recommendation = shown["recommendation"]
    assert isinstance(recommendation, dict)
    assert recommendation["setting"] == _readme_commands()[name]
    monkeypatch.delenv("DIFFGEMMA_SIMULATED_MACHINE")
    with simulated(machine, tmp_path):
        real = _plan_cli(RELEASE, capsys)
    scaled = _scaled(machine, real, small_spec, recommendation["precision"])
    _load_and_complete(release_random_dir, recommendation["setting"], scaled, tmp_path)


def test_the_simulation_refuses_what_the_machine_could_not_serve(tmp_path: Path) -> None:
    """The check at ``from_pretrained``: devices the machine lacks, disk without a folder, torchao on MPS, fp8 with
    offload or below Ada; what passes goes to the CPU."""
    from transformers import FineGrainedFP8Config

    from diffgemma_engine.loading.quantize import int8_config
    from tests.support.devices import SimulatedLoadError, Simulation

    ada = Machine(gpus=(GPU(free=23 * GIB, total=24 * GIB, capability=(8, 6)),), mps_limit=8 * GIB)
    simulation = Simulation(ada, tmp_path / "meminfo")
    refused = [
        {"device_map": {"": "cuda:1"}},
        {"device_map": {"a": "cuda:0", "b": "disk"}},
        {"device_map": {"": "mps"}, "quantization_config": int8_config()},
        {"device_map": {"a": "cuda:0", "b": "cpu"}, "quantization_config": FineGrainedFP8Config()},
        {"device_map": {"": "cuda:0"}, "quantization_config": FineGrainedFP8Config()},
        {"device_map": "auto"},
    ]
    for kwargs in refused:
        with pytest.raises(SimulatedLoadError):
            simulation.checked(kwargs)
    assert simulation.checked({"device_map": {"a": "cuda:0", "b": "cpu"}})["device_map"] == {"": "cpu"}
    kept = simulation.checked({"device_map": {"a": "mps", "b": "disk"}, "offload_folder": "x"})["device_map"]
    assert kept == {"a": "cpu", "b": "disk"}
