"""``diffgemma-engine plan``: the release's memory from its config alone; the small checkpoints' against their files."""

from __future__ import annotations

import collections
import json
import math
import re
import shutil
import subprocess
import sys
import weakref
from pathlib import Path

import pytest

from diffgemma_engine.loading import plan as planning
from diffgemma_engine.loading.plan import (
    DOES_NOT_FIT,
    FITS_CPU,
    FITS_GPU,
    FITS_WITH_OFFLOAD,
    GIB,
    MIB,
    AttentionLayer,
    Device,
    ModelSpec,
    PlanError,
    StoredCheckpoint,
    Weight,
    make_plan,
    parse_max_memory,
    parse_size,
    place,
    read_spec,
    request_memory,
    select_devices,
    weight_bytes,
)
from diffgemma_engine.loading.quantize_policy import stays_unquantized

ROOT = Path(__file__).resolve().parents[2]
RELEASE = ROOT / "tests" / "data" / "release"


@pytest.fixture(scope="module")
def release_dir(module_tmp: Path) -> Path:
    """The release's config.json and generation_config.json, no weights."""
    folder = module_tmp / "release"
    folder.mkdir()
    for name in ("config.json", "generation_config.json"):
        shutil.copy(RELEASE / name, folder / name)
    return folder


@pytest.fixture(scope="module")
def release(release_dir: Path) -> ModelSpec:
    return read_spec(release_dir)


def _plan(spec: ModelSpec, machine: str) -> planning.Plan:
    return make_plan(spec, parse_max_memory(machine))


def _verdicts(plan: planning.Plan) -> dict[str, str]:
    return {placement.precision: placement.verdict for placement in plan.placements}


# -- the release, on the meta device -----------------------------------------------------------------------------


def test_the_release_builds_on_the_meta_device_in_seconds_and_ties(release: ModelSpec) -> None:
    assert release.build_s < 10
    assert round(release.parameters / 1e9, 2) == 25.82
    assert round(release.parameters_before_tie / 1e9, 1) == 51.8
    assert release.architecture == "DiffusionGemmaForBlockDiffusion"
    assert (release.canvas_length, release.vocab_size) == (256, 262_144)
    assert release.stored == StoredCheckpoint(dtype="bfloat16", bytes=None, source=None)
    # encoder layer i and decoder layer i share every weight: one placement unit each, named by the encoder's
    units = {weight.unit for weight in release.weights}
    assert "model.encoder.language_model.layers.7" in units
    assert not any(unit.startswith("model.decoder.layers.") for unit in units)


def test_the_release_weighs_48_gib_in_bf16_and_under_60_percent_of_that_quantized(release: ModelSpec) -> None:
    gib = make_plan(release, []).weights_bytes
    gib = {precision: count / GIB for precision, count in gib.items()}
    assert round(gib["bfloat16"], 1) == 48.1
    assert gib["float32"] == pytest.approx(2 * gib["bfloat16"], rel=1e-6)
    for precision in ("fp8", "int8", "int4"):
        assert gib[precision] < 0.6 * gib["bfloat16"]
    assert gib["fp8"] < gib["bfloat16"] and gib["int8"] < gib["bfloat16"]
    assert gib["int4"] < gib["int8"]
    # the published 4-bit builds are 16-17.5 GB: int4 at 128-weight groups is in that range
    assert 14.0 < gib["int4"] < 16.5


def test_the_release_shares_match_its_readme(release: ModelSpec) -> None:
    plan = make_plan(release, [])
    assert plan.shares["routed_experts"] * 100 == pytest.approx(88.4, abs=0.1)
    assert plan.linear_anywhere_share * 100 == pytest.approx(8.6, abs=0.1)  # every nn.Linear, the vision tower's too
    assert plan.shares["embedding"] * 100 == pytest.approx(2.9, abs=0.1)
    assert plan.shares["vision"] * 100 == pytest.approx(2.2, abs=0.1)
    assert plan.shares["linear"] * 100 == pytest.approx(6.5, abs=0.1)  # the text stack's alone
    assert sum(plan.shares.values()) == pytest.approx(1.0)


def test_only_expert_and_text_linear_matrices_are_quantized(release: ModelSpec) -> None:
    quantized = [weight for weight in release.weights if weight.quantized]
    assert {weight.kind for weight in quantized} == {"routed_experts", "linear"}
    assert all(len(weight.shape) >= 2 for weight in quantized)
    assert all(weight.kind in ("routed_experts", "linear") for weight in quantized)
    kept = {weight.name for weight in release.weights if not weight.quantized}
    assert "model.encoder.language_model.embed_tokens.weight" in kept
    assert "model.encoder.language_model.layers.3.router.proj.weight" in kept
    assert not any(weight.kind == "vision" for weight in quantized)
    experts = sum(weight.numel for weight in release.weights if weight.kind == "routed_experts")
    assert experts == sum(weight.numel for weight in quantized if weight.kind == "routed_experts")


def test_the_release_request_memory(release: ModelSpec) -> None:
    text = json.loads((RELEASE / "config.json").read_text())["text_config"]
    full = [int(index) for index in text["per_layer_config"]]
    per_token = sum(
        2
        * 2
        * text["per_layer_config"][f"{i:02d}"]["num_key_value_heads"]
        * text["per_layer_config"][f"{i:02d}"]["head_dim"]
        if i in full
        else 2 * 2 * text["num_key_value_heads"] * text["head_dim"]
        for i in range(text["num_hidden_layers"])
    )
    request = make_plan(release, []).requests["bfloat16"]
    assert request.kv_bytes_per_token == per_token == 225_280  # 25 x 8 heads x 256 + 5 x 2 heads x 512, K and V
    assert request.kv_bytes_per_token_full == 5 * 2 * 2 * 2 * 512
    # 2048 tokens: the sliding layers hold 1023, the full ones all 2048
    assert request.kv_prompt_bytes == 25 * 1023 * 2 * 2 * 8 * 256 + 5 * 2048 * 2 * 2 * 2 * 512
    assert request.step_tensor_bytes == 256 * MIB  # 256 x 262,144 x 4 bytes
    assert request.step_tensors == 2.5  # scaled bf16 logits (the next self-conditioning), float32 scores, probs
    assert make_plan(release, []).requests["float32"].kv_bytes_per_token == 2 * per_token


# -- the release on described machines ---------------------------------------------------------------------------


def test_an_80_gib_gpu_holds_the_release_in_bf16(release: ModelSpec) -> None:
    plan = _plan(release, "cuda:0=80GiB")
    verdicts = _verdicts(plan)
    assert verdicts["bfloat16"] == FITS_GPU
    assert verdicts["float32"] == DOES_NOT_FIT
    assert plan.recommendation is not None and plan.recommendation.precision == "bfloat16"
    assert plan.recommendation.setting == "--device cuda:0"


def test_a_24_gib_gpu_holds_the_release_only_with_offload_int4_being_unavailable(release: ModelSpec) -> None:
    for machine in ("cuda:0=24GiB,cpu=64GiB", "0=24GiB,cpu=64GiB"):
        plan = _plan(release, machine)
        verdicts = _verdicts(plan)
        assert verdicts["bfloat16"] == FITS_WITH_OFFLOAD
        assert verdicts["int4"] == FITS_GPU  # it would fit, but the engine cannot run it: never recommended
        int4 = next(placement for placement in plan.placements if placement.precision == "int4")
        assert int4.setting is None
        assert plan.recommendation is not None
        assert plan.recommendation.setting == "--device cuda:0,cpu --quantization int8"
    bf16 = next(placement for placement in plan.placements if placement.precision == "bfloat16")
    gpu, cpu = bf16.shares
    assert gpu.weights_bytes + gpu.reserved_bytes <= 24 * GIB and cpu.weights_bytes <= 64 * GIB
    assert gpu.weights_bytes + cpu.weights_bytes == plan.loaded_bytes["bfloat16"]  # text only: no vision tower
    assert bf16.setting == "--device cuda:0,cpu"


def test_64_gib_of_ram_holds_the_release_in_bf16(release: ModelSpec) -> None:
    plan = _plan(release, "cpu=64GiB")
    verdicts = _verdicts(plan)
    assert verdicts["bfloat16"] == FITS_CPU
    assert verdicts["float32"] == DOES_NOT_FIT
    assert plan.recommendation is not None and plan.recommendation.setting == "--device cpu"


def test_two_gpus_share_the_release(release: ModelSpec) -> None:
    plan = _plan(release, "cuda:0=32GiB,cuda:1=32GiB,cpu=16GiB")
    assert plan.recommendation is not None
    assert (plan.recommendation.precision, plan.recommendation.setting) == ("bfloat16", "--device cuda:0,1")


def test_nothing_fits_a_tiny_machine(release: ModelSpec) -> None:
    plan = _plan(release, "cuda:0=4GiB,cpu=8GiB")
    assert set(_verdicts(plan).values()) == {DOES_NOT_FIT}
    assert plan.recommendation is None
    assert "nothing fits" in planning.format_plan(plan)


# -- the command -------------------------------------------------------------------------------------------------


def test_the_cli_prints_one_json_object(release_dir: Path) -> None:
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "diffgemma_engine",
            "plan",
            "--model",
            str(release_dir),
            "--json",
            "--max-memory",
            "0=24GiB",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert isinstance(result["parameters"], int) and round(result["parameters"] / 1e9, 2) == 25.82
    assert set(result["weights_gib"]) >= {"bfloat16", "float32", "fp8", "int8", "int4"}
    assert round(result["weights_gib"]["bfloat16"], 1) == 48.1
    assert result["requests"]["bfloat16"]["step_tensor_mib"] == 256.0
    assert result["devices"] == [{"name": "cuda:0", "gib": 24.0, "source": "--max-memory"}]
    assert result["placements"]["bfloat16"]["verdict"] == DOES_NOT_FIT  # no CPU described: nowhere to offload
    assert result["placements"]["int4"]["verdict"] == FITS_GPU
    assert "int4" in result["quantization"]["unavailable"]
    assert result["recommendation"] is None  # int8 (25.3 GiB) does not fit 24 GiB and nothing else is described


def test_the_cli_names_the_missing_config(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "diffgemma_engine", "plan", "--model", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert out.returncode != 0
    assert str(tmp_path / "config.json") in out.stderr and "missing" in out.stderr
    assert out.stdout == ""


def test_a_config_of_another_model_is_refused(tmp_path: Path) -> None:
    from diffgemma_engine.errors import ModelLoadError

    (tmp_path / "config.json").write_text('{"model_type": "bert"}')
    with pytest.raises(ModelLoadError, match="'bert' model, not DiffusionGemma"):
        read_spec(tmp_path)


# -- the small checkpoints, against their files ------------------------------------------------------------------


def _stored_bytes(folder: Path) -> tuple[int, str]:
    """Bytes of every tensor in the folder's safetensors (headers only), and their dtype."""
    from safetensors import safe_open

    sizes = {"BF16": 2, "F16": 2, "F32": 4}
    total, dtypes = 0, set()
    for path in sorted(folder.glob("*.safetensors")):
        with safe_open(path, "pt") as handle:
            for key in handle.keys():
                tensor = handle.get_slice(key)
                dtypes.add(tensor.get_dtype())
                total += math.prod(tensor.get_shape()) * sizes[tensor.get_dtype()]
    assert len(dtypes) == 1
    return total, {"BF16": "bfloat16", "F32": "float32"}[dtypes.pop()]


@pytest.mark.parametrize("fixture", ["release_random_dir", "random_model_dir"])
def test_a_small_checkpoint_weighs_what_its_files_hold(fixture: str, request: pytest.FixtureRequest) -> None:
    folder: Path = request.getfixturevalue(fixture)
    stored, dtype = _stored_bytes(folder)
    spec = read_spec(folder)
    planned = make_plan(spec, []).weights_bytes[dtype]
    assert spec.stored.dtype == dtype
    assert spec.stored.bytes == pytest.approx(stored, rel=1e-3)
    assert planned == pytest.approx(stored, rel=0.02)  # the difference: rotary buffers, not stored


def test_a_folder_with_the_index_and_some_shards_plans_as_incomplete(tmp_path: Path, release_random_dir: Path) -> None:
    """It planned as the index's full size stored, and failed deep in the load."""
    folder = tmp_path / "model"
    shutil.copytree(release_random_dir, folder, ignore=shutil.ignore_patterns("model-0000[3-6]-*"))
    plan = make_plan(read_spec(folder), parse_max_memory("cpu=8GiB"))
    missing = [f"model-0000{n}-of-00006.safetensors is missing" for n in range(3, 7)]
    assert plan.spec.stored.missing == tuple(missing)
    assert planning.plan_json(plan)["stored"]["missing"] == missing
    assert f"  incomplete: {'; '.join(missing)}: the engine will not load this folder" in planning.format_plan(plan)
    assert read_spec(release_random_dir).stored.missing == ()


@pytest.fixture(scope="module")
def release_model(release_random_dir: Path):
    from diffgemma_engine.loading.model import load_model

    return load_model(release_random_dir, "cpu", "bfloat16")


def test_the_prefix_cache_holds_what_the_plan_says(release_model, release_random_dir: Path) -> None:
    import torch

    from diffgemma_engine.canvas.caches import DEFAULT_SLOTS, PrefixCache

    assert planning.PREFIX_CACHE_SLOTS == DEFAULT_SLOTS
    spec = read_spec(release_random_dir)
    window = spec.attention[0].window
    assert window is not None
    for tokens in (40, window + 72):  # within the window, and past it
        prefixes = PrefixCache(release_model.model)
        view, _ = prefixes.prepare("doc", torch.randint(3, 200, (tokens,)).tolist())
        master = prefixes._masters["doc"][0]
        storages: dict[int, int] = {}
        for cache in (master, view):
            for layer in cache.layers:
                for tensor in (layer.keys, layer.values):
                    storages[tensor.untyped_storage().data_ptr()] = tensor.untyped_storage().nbytes()
        windowed = sum(t.numel() * t.element_size() for layer in view.layers for t in (layer.keys, layer.values))
        expected = request_memory(
            spec.attention, canvas_length=spec.canvas_length, vocab_size=spec.vocab_size, prompt_tokens=tokens
        )
        assert windowed == expected.kv_prompt_bytes
        assert sum(storages.values()) == expected.kv_engine_document_bytes


def _step_peak(loaded) -> float:
    """The most vocabulary-sized tensors (in float32 units) alive at once while ``denoise_canvas`` runs."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from transformers import DynamicCache

    from diffgemma_engine.canvas.caches import encode_prompt
    from diffgemma_engine.canvas.denoise import denoise_canvas
    from diffgemma_engine.canvas.sampler import SamplerSettings

    model = loaded.model
    canvas, vocab = 16, model.config.text_config.vocab_size
    alive: dict[int, float] = {}
    views: collections.Counter[int] = collections.Counter()
    peak = [0.0]

    def release(key: int) -> None:
        views[key] -= 1
        if not views[key]:
            del views[key]
            alive.pop(key, None)

    class Track(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for tensor in out if isinstance(out, (tuple, list)) else [out]:
                if isinstance(tensor, torch.Tensor) and tensor.untyped_storage().nbytes() >= canvas * vocab * 2:
                    key = tensor.untyped_storage().data_ptr()
                    alive[key] = tensor.untyped_storage().nbytes() / (canvas * vocab * 4)
                    views[key] += 1
                    weakref.finalize(tensor, release, key)
                    peak[0] = max(peak[0], sum(alive.values()))
            return out

    cache = DynamicCache(config=model.config.get_text_config(decoder=True))
    with torch.inference_mode():
        encode_prompt(model, torch.randint(3, vocab, (1, 40)), cache)
    with Track():
        denoise_canvas(model, cache, 1, canvas, SamplerSettings(max_steps=4), torch.Generator().manual_seed(0))
    return peak[0]


def test_the_step_keeps_as_many_vocabulary_sized_tensors_as_the_plan_assumes(release_model, random_model_dir) -> None:
    from diffgemma_engine.loading.model import load_model

    assert _step_peak(release_model) == planning.STEP_VOCAB_TENSORS - planning.HALF_PRECISION_SAVING  # bfloat16
    assert _step_peak(load_model(random_model_dir, "cpu", "float32")) == planning.STEP_VOCAB_TENSORS


# -- the arithmetic ----------------------------------------------------------------------------------------------


def test_the_skip_list() -> None:
    for name in (
        "model.encoder.language_model.embed_tokens.weight",
        "lm_head.weight",
        "model.decoder.layers.0.router.proj.weight",
        "model.decoder.layers.0.router.per_expert_scale",
        "model.decoder.layers.0.input_layernorm.weight",
        "model.decoder.layers.0.self_attn.q_norm.weight",
        "model.decoder.layers.0.self_attn.q_proj.bias",
        "model.decoder.layers.0.layer_scalar",
        "model.encoder.vision_tower.encoder.layers.0.mlp.down_proj.linear.weight",
        "model.encoder.embed_vision.embedding_projection.weight",
        "model.decoder.self_conditioning.pre_norm.weight",
    ):
        assert stays_unquantized(name), name
    for name in (
        "model.decoder.layers.0.experts.gate_up_proj",
        "model.encoder.language_model.layers.9.experts.down_proj",
        "model.decoder.layers.0.mlp.down_proj.weight",
        "model.decoder.layers.0.self_attn.o_proj.weight",
        "model.decoder.self_conditioning.gate_proj.weight",
    ):
        assert not stays_unquantized(name), name


def test_quantized_bytes() -> None:
    linear = Weight(name="layers.0.mlp.up_proj.weight", shape=(256, 300), kind="linear", unit="layers.0")
    experts = Weight(name="layers.0.experts.down_proj", shape=(4, 64, 704), kind="routed_experts", unit="layers.0")
    norm = Weight(name="layers.0.input_layernorm.weight", shape=(300,), kind="other", unit="layers.0")
    assert weight_bytes(linear, "float32") == 4 * 256 * 300
    assert weight_bytes(linear, "bfloat16") == 2 * 256 * 300
    assert weight_bytes(linear, "int8") == 256 * 300 + 256 * 5  # a float32 scale and an int8 zero point per row
    assert weight_bytes(linear, "fp8") == 256 * 300 + 4 * 5 * 4  # a float32 scale per 64 x 64 block
    assert weight_bytes(experts, "fp8") == 4 * 64 * 704 + 4 * (1 * 11) * 4
    assert weight_bytes(linear, "int4") == 256 * 300 // 2 + 256 * 3 * 2  # 300 inputs: 3 groups of up to 128
    assert weight_bytes(experts, "int4") == 4 * 64 * 704 // 2 + 4 * 64 * 6 * 2
    assert all(weight_bytes(norm, precision) == 600 for precision in ("bfloat16", "fp8", "int8", "int4"))
    with pytest.raises(PlanError):
        weight_bytes(linear, "int3")


def test_request_memory_caps_only_the_sliding_layers() -> None:
    layers = [AttentionLayer(kv_width=64, window=8), AttentionLayer(kv_width=128, window=None)]
    short = request_memory(layers, canvas_length=4, vocab_size=10, prompt_tokens=5)
    assert short.kv_bytes_per_token == 2 * 2 * (64 + 128)
    assert short.kv_prompt_bytes == short.kv_engine_document_bytes == 5 * short.kv_bytes_per_token
    long = request_memory(layers, canvas_length=4, vocab_size=10, prompt_tokens=20, rows=2)
    assert long.kv_prompt_bytes == 7 * 2 * 2 * 64 + 20 * 2 * 2 * 128
    assert long.kv_engine_document_bytes == 20 * long.kv_bytes_per_token + 7 * 2 * 2 * 64
    assert long.step_tensor_bytes == 4 * 10 * 4 and long.step_bytes == round(2.5 * 160)
    assert long.reserve_bytes == 2 * (long.kv_engine_document_bytes + long.step_bytes)
    assert request_memory(layers, canvas_length=4, vocab_size=10, prompt_tokens=5, dtype="float32").step_tensors == 3


def _devices(**sizes: int) -> list[Device]:
    return [Device(name=name.replace("_", ":"), bytes=size, source="test") for name, size in sizes.items()]


def test_place_fills_devices_in_order() -> None:
    units = [("embed", 4), ("layer0", 10), ("layer1", 10), ("layer2", 10)]
    whole = place(units, _devices(cuda_0=40, cpu=100), "bfloat16", request_bytes=5)
    assert (whole.verdict, whole.used_devices, whole.setting) == (FITS_GPU, ("cuda:0",), "--device cuda:0")
    split = place(units, _devices(cuda_1=20, cuda_0=20), "int8", request_bytes=2)
    assert split.verdict == FITS_GPU and [s.units for s in split.shares] == [("embed", "layer0"), ("layer1", "layer2")]
    assert split.setting == "--device cuda:0,1 --quantization int8"
    # offloading keeps room for the largest unit on the GPU: 30 - 5 - 10 leaves room for embed and one layer
    offload = place(units, _devices(cuda_0=30, cpu=100), "bfloat16", request_bytes=5)
    assert offload.verdict == FITS_WITH_OFFLOAD
    assert [s.units for s in offload.shares] == [("embed", "layer0"), ("layer1", "layer2")]
    assert offload.shares[0].reserved_bytes == 15 and offload.setting == "--device cuda:0,cpu"
    assert place(units, _devices(cpu=40), "float32", 0).setting == "--device cpu --dtype float32"  # not bf16's own
    assert place(units, _devices(cpu=40), "float32", 0, stored_dtype="float32").setting == "--device cpu"
    short = place(units, _devices(cuda_0=20, cpu=10), "bfloat16", 0)
    assert short.verdict == DOES_NOT_FIT and short.unplaced_bytes > 0 and short.setting is None
    assert place(units, [], "bfloat16", 0).verdict == DOES_NOT_FIT


def test_max_memory_and_device_specs() -> None:
    assert parse_size("24GiB") == 24 * GIB and parse_size("24GB") == 24 * 10**9 and parse_size("512 mib") == 512 * MIB
    assert parse_size("1.5GiB") == 3 * GIB // 2 and parse_size("1000") == 1000
    devices = parse_max_memory("cpu=64GiB, 1=8GiB,cuda:0=24GiB")
    assert [(d.name, d.bytes) for d in devices] == [("cuda:0", 24 * GIB), ("cuda:1", 8 * GIB), ("cpu", 64 * GIB)]
    for bad in ("cuda:0", "gpu=3GiB", "cpu=lots", "cpu=1GiB,cpu=2GiB", "disk=1TB", ""):
        with pytest.raises(PlanError):
            parse_max_memory(bad)
    assert [d.name for d in select_devices(devices, "cuda:0,1")] == ["cuda:0", "cuda:1"]
    assert [d.name for d in select_devices(devices, "cuda")] == ["cuda:0", "cuda:1"]
    assert [d.name for d in select_devices(devices, "cuda:1,cpu")] == ["cuda:1", "cpu"]
    assert [d.name for d in select_devices(devices, "auto")] == ["cuda:0", "cuda:1", "cpu"]
    with pytest.raises(PlanError, match="no cuda:2"):
        select_devices(devices, "cuda:2")


def test_devices_are_detected(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    cpu = planning.detect_devices()[-1]
    assert cpu.name == "cpu" and cpu.bytes > 0
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda index: ((10 + index) * GIB, 80 * GIB))
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    devices = planning.detect_devices()
    assert [(d.name, d.bytes) for d in devices[:2]] == [("cuda:0", 10 * GIB), ("cuda:1", 11 * GIB)]
    assert devices[2].name == "cpu"


def test_the_text_report_names_the_figures(release: ModelSpec) -> None:
    text = planning.format_plan(_plan(release, "cuda:0=24GiB,cpu=64GiB"))
    assert "25.82 B after the encoder/decoder tie" in text
    assert "bfloat16 48.1 GiB" in text
    assert "220.0 KiB per prompt token" in text
    assert "256 MiB vocabulary-sized tensors" in text
    assert "use: --device cuda:0,cpu --quantization int8" in text
    assert "int4" in text and "not available in the engine" in text


def test_the_shipped_models_plan_reads_in_units_that_fit_it() -> None:
    """2.6M parameters and 5 MiB of weights, not ``0.00 B`` and ``0.0 GiB`` (units sized for the release)."""
    from diffgemma_engine.loading.model import DEFAULT_MODEL_DIR

    text = planning.format_plan(make_plan(read_spec(DEFAULT_MODEL_DIR), parse_max_memory("cpu=8GiB")))
    assert "0.00 B" not in text and " 0.0 GiB" not in text and " 0 MiB" not in text, text
    assert re.search(r"parameters: 2\.\d\d M after the encoder/decoder tie", text), text
    assert re.search(r"weights: bfloat16 5 MiB, float32 10 MiB", text), text


def test_the_release_plan_keeps_its_units(release: ModelSpec) -> None:
    text = planning.format_plan(_plan(release, "cuda:0=80GiB"))
    assert re.search(r"parameters: 2\d\.\d\d B after", text) and "weights: bfloat16 4" in text, text
