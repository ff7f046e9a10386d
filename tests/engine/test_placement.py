"""Where the engine puts a checkpoint: the devices ``--device`` names, the ``auto`` dtype, the device map over
several devices (the release's shape on the meta device), a bf16 load that stays file-backed, and a model spread
over the CPU and the disk that still gives the memorized answer."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from diffgemma_engine.errors import ModelLoadError
from diffgemma_engine.loading import placement
from diffgemma_engine.loading.model import load_model
from diffgemma_engine.loading.placement import Devices, parse_devices, pick_dtype
from diffgemma_engine.request.infill import run_infill
from diffgemma_engine.shared import protocol
from tests.support.release_format import ANSWERED_LANGUAGE, ANSWERED_PREFIX, ANSWERED_SUFFIX, RAW_ANSWER

ROOT = Path(__file__).resolve().parents[2]
RELEASE_CONFIG = ROOT / "tests" / "data" / "release"
GIB = 1 << 30


@pytest.mark.parametrize(
    ("spec", "cuda", "mps", "names"),
    [
        ("auto", 0, False, ("cpu",)),
        ("auto", 0, True, ("mps",)),
        ("auto", 2, False, ("cuda:0", "cuda:1")),
        (None, 1, True, ("cuda:0",)),
        ("cpu", 2, False, ("cpu",)),
        ("cuda", 1, False, ("cuda:0",)),
        ("cuda:0,1", 2, False, ("cuda:0", "cuda:1")),
        ("cuda:1,cpu", 2, False, ("cuda:1", "cpu")),
        ("cuda:0,cpu,disk", 1, False, ("cuda:0", "cpu", "disk")),
        ("CPU, disk", 0, False, ("cpu", "disk")),
        ("mps", 0, True, ("mps",)),
    ],
)
def test_devices_named(spec: str | None, cuda: int, mps: bool, names: tuple[str, ...]) -> None:
    assert parse_devices(spec, cuda, mps) == Devices(names)


@pytest.mark.parametrize(
    ("spec", "cuda", "mps", "message"),
    [
        ("cuda", 0, False, "no cuda:0 here"),
        ("cuda:0,2", 2, False, "no cuda:2 here"),
        ("mps", 0, False, "MPS is not available"),
        ("disk", 0, False, "disk can only come last"),
        ("disk,cpu", 0, False, "disk can only come last"),
        ("cpu,cpu", 0, False, "names cpu twice"),
        ("tpu", 0, False, "unknown device 'tpu'"),
    ],
)
def test_devices_this_machine_cannot_serve_are_refused_clearly(spec: str, cuda: int, mps: bool, message: str) -> None:
    with pytest.raises(ModelLoadError, match=message):
        parse_devices(spec, cuda, mps)


@pytest.mark.parametrize(
    ("name", "stored", "device", "dtype"),
    [
        ("auto", "bfloat16", "cpu", torch.bfloat16),  # the checkpoint's own, on the CPU too
        ("auto", "bfloat16", "mps", torch.bfloat16),
        ("auto", "float32", "cuda:0", torch.float32),
        ("auto", "float16", "cuda:0", torch.float16),
        ("auto", "float16", "cpu", torch.float32),
        (None, None, "cpu", torch.float32),
        ("float32", "bfloat16", "cpu", torch.float32),
    ],
)
def test_the_auto_dtype_is_the_checkpoints(
    name: str | None, stored: str | None, device: str, dtype: torch.dtype
) -> None:
    assert pick_dtype(name, stored, device) == dtype


def test_an_unknown_dtype_is_refused() -> None:
    with pytest.raises(ModelLoadError, match="unknown dtype 'fp4'"):
        pick_dtype("fp4", "bfloat16", "cpu")


def _release_config_only(tmp_path: Path) -> Path:
    folder = tmp_path / "release"
    shutil.copytree(RELEASE_CONFIG, folder)
    return folder


def _covers_every_tensor(where: dict[str, str], folder: Path) -> dict[str, str]:
    """The device of every tensor of the release model as the engine loads it (text only:
    ``diffgemma_engine.loading.text_only``), under each of its names, by the map, as accelerate reads it: the key that
    is the tensor's module or an ancestor of it. Fails on a tensor no key covers, or two."""
    from transformers import AutoConfig

    from diffgemma_engine.loading.text_only import _text_only_class

    with torch.device("meta"):
        model = _text_only_class()(AutoConfig.from_pretrained(folder))
    model.tie_weights()
    found: dict[str, str] = {}
    names = [name for name, _ in model.named_parameters(remove_duplicate=False)]
    names += [name for name, _ in model.named_buffers(remove_duplicate=False)]
    for name in names:
        keys = [key for key in where if name.startswith(key + ".")]
        assert len(keys) == 1, (name, keys)
        found[name] = where[keys[0]]
    return found


def test_two_gpus_share_the_release_with_tied_layers_together(tmp_path: Path) -> None:
    folder = _release_config_only(tmp_path)
    memory = {"cuda:0": 30 * GIB, "cuda:1": 30 * GIB}
    where = placement.device_map(folder, Devices(("cuda:0", "cuda:1")), torch.bfloat16, memory)
    found = _covers_every_tensor(where, folder)
    assert set(where.values()) == {"cuda:0", "cuda:1"}
    for layer in range(30):  # encoder layer i and decoder layer i are one set of weights: one device
        encoder = found[f"model.encoder.language_model.layers.{layer}.self_attn.q_proj.weight"]
        assert found[f"model.decoder.layers.{layer}.self_attn.q_proj.weight"] == encoder
    assert found["model.encoder.language_model.embed_tokens.weight"] == "cuda:0"  # where the inputs go
    assert found["lm_head.weight"] == "cuda:0"  # tied to it
    assert found["model.decoder.layers.29.experts.down_proj"] == "cuda:1"


def test_a_24_gib_card_offloads_the_rest_of_the_release_to_ram(tmp_path: Path) -> None:
    folder = _release_config_only(tmp_path)
    memory = {"cuda:0": 24 * GIB, "cpu": 64 * GIB}
    found = _covers_every_tensor(
        placement.device_map(folder, Devices(("cuda:0", "cpu")), torch.bfloat16, memory), folder
    )
    assert found["model.encoder.language_model.layers.0.experts.gate_up_proj"] == "cuda:0"
    assert found["model.encoder.language_model.layers.29.experts.gate_up_proj"] == "cpu"
    assert not [key for key in found if "vision" in key]  # not loaded at all
    assert found["model.decoder.rotary_emb.full_attention_inv_freq"] == "cuda:0"


def test_a_machine_too_small_is_told_what_to_add(tmp_path: Path) -> None:
    folder = _release_config_only(tmp_path)
    with pytest.raises(ModelLoadError, match=r"does not fit on cuda:0,cpu: .* GiB .* add cpu or disk"):
        placement.device_map(folder, Devices(("cuda:0", "cpu")), torch.bfloat16, {"cuda:0": 24 * GIB, "cpu": 8 * GIB})


def test_auto_loads_the_checkpoints_own_dtype_on_the_cpu(release_random_dir: Path, random_model_dir: Path) -> None:
    assert load_model(release_random_dir).model.dtype == torch.bfloat16
    assert load_model(random_model_dir).model.dtype == torch.float32


ANON_PROBE = r"""
import json, sys
from diffgemma_engine.loading.model import load_model

def anon():
    for line in open("/proc/self/status"):
        if line.startswith("RssAnon"):
            return int(line.split()[1]) * 1024

load_model(sys.argv[3], "cpu", sys.argv[2])  # a small one first: what a first load imports is not the weights
before = anon()
loaded = load_model(sys.argv[1], "cpu", sys.argv[2])
weights = sum(t.numel() * t.element_size() for t in {id(p): p for p in loaded.model.parameters()}.values())
print(json.dumps({"anon_growth": anon() - before, "weights": weights}))
"""


def _anon_growth(folder: Path, dtype: str, warm_up: Path) -> dict[str, int]:
    done = subprocess.run(
        [sys.executable, "-c", ANON_PROBE, str(folder), dtype, str(warm_up)],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_bf16_load_leaves_the_weights_in_the_files_pages(release_wide_dir: Path, release_random_dir: Path) -> None:
    """The weights are the safetensors' own mapped pages, not a copy in anonymous memory; the float32 load of the
    same files (a conversion) shows what a copy costs, so the measure is seen to work."""
    same = _anon_growth(release_wide_dir, "auto", release_random_dir)
    converted = _anon_growth(release_wide_dir, "float32", release_random_dir)
    print(
        f"placement: bf16 load of {same['weights'] / 2**20:.0f} MiB grew anonymous memory by "
        f"{same['anon_growth'] / 2**20:.1f} MiB; a float32 load of it by {converted['anon_growth'] / 2**20:.0f} MiB"
    )
    assert same["anon_growth"] < 0.1 * same["weights"], same
    assert converted["anon_growth"] > 0.8 * converted["weights"], converted


@pytest.mark.parametrize("cpu_memory", ["300KiB", "1MiB"])
def test_a_model_spread_over_the_cpu_and_the_disk_answers_the_same(
    release_memorized_dir: Path, tmp_path: Path, cpu_memory: str
) -> None:
    offload = tmp_path / "offload"
    loaded = load_model(
        release_memorized_dir, "cpu,disk", "auto", max_memory=f"cpu={cpu_memory}", offload_folder=offload
    )
    spread = loaded.model.hf_device_map
    assert {"cpu", "disk"} <= set(spread.values()), spread
    on_disk = [name for name, device in spread.items() if device == "disk"]
    module = loaded.model.get_submodule(on_disk[0])
    assert all(p.device.type == "meta" for p in module.parameters())  # not in memory: read from the files per use
    request = protocol.Infill(
        id="1", uri="", prefix=ANSWERED_PREFIX, suffix=ANSWERED_SUFFIX, language_id=ANSWERED_LANGUAGE, seed=0
    )
    text, _, _ = run_infill(loaded, request)
    assert text == RAW_ANSWER


@pytest.mark.parametrize(("free_gib", "slots", "rows"), [(80, 16, 64), (10, 4, 8), (1, 1, 1), (0, 1, 1)])
def test_cached_prompts_and_step_rows_follow_the_free_memory(
    tmp_path: Path, free_gib: int, slots: int, rows: int
) -> None:
    """The release at a 2048-token prompt: 640 MiB per cached document, 640 MiB per canvas row (bf16)."""
    from diffgemma_engine.loading import plan

    spec = plan.read_spec(_release_config_only(tmp_path))
    request = plan.request_memory(
        spec.attention, canvas_length=spec.canvas_length, vocab_size=spec.vocab_size, prompt_tokens=2048
    )
    limits = plan.serving_limits(free_gib * GIB, request, max_slots=16, max_rows=64)
    assert (limits.cache_slots, limits.rows) == (slots, rows)


def test_a_gpu_too_small_is_refused_before_loading_with_the_plans_advice(tmp_path: Path) -> None:
    folder = _release_config_only(tmp_path)
    placement.check_fits(folder, "cuda:0", torch.bfloat16, 80 * GIB)  # fits: nothing said
    with pytest.raises(ModelLoadError) as refused:
        placement.check_fits(folder, "cuda:0", torch.bfloat16, 24 * GIB)
    message = str(refused.value)
    assert "does not fit on cuda:0: the weights need 47.0 GiB in bfloat16" in message  # text only
    assert "use --device cuda:0,cpu --quantization int8" in message  # int4 would fit, but cannot run
