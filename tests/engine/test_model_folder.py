"""A model folder chosen by a repository or a typo is read with limits and refused with a clear reason."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
import transformers

from diffgemma_engine.errors import ModelLoadError
from diffgemma_engine.loading.checkpoint_files import MAX_SETTINGS_FILE_BYTES
from diffgemma_engine.loading.model import load_model
from diffgemma_engine.training.data import ExampleMaker


@pytest.mark.parametrize("name", ["config.json", "generation_config.json", "diffgemma.json"])
def test_a_huge_settings_file_is_refused_before_it_is_read(tmp_path: Path, release_random_dir: Path, name: str) -> None:
    folder = tmp_path / "model"
    shutil.copytree(release_random_dir, folder)
    (folder / name).write_text("{" + " " * (MAX_SETTINGS_FILE_BYTES + 1) + "}")
    with pytest.raises(ModelLoadError, match=f"{name} is {MAX_SETTINGS_FILE_BYTES + 3} bytes"):
        load_model(folder)


def test_a_folder_without_a_checkpoint_says_so(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="config.json is missing"):
        load_model(tmp_path)


@pytest.mark.parametrize(
    "hints", ['{"max_prompt_tokens": -5}', '{"line_canvas_length": 0}', '{"chat_order": "sideways"}', "[1]", "{"]
)
def test_a_bad_hint_is_refused_at_load_with_its_key(tmp_path: Path, release_random_dir: Path, hints: str) -> None:
    folder = tmp_path / "model"
    shutil.copytree(release_random_dir, folder)
    (folder / "diffgemma.json").write_text(hints)
    with pytest.raises(ModelLoadError, match="diffgemma.json|chat_order"):
        load_model(folder)


def test_a_folder_without_a_tokenizer_says_so(tmp_path: Path, release_random_dir: Path) -> None:
    folder = tmp_path / "model"
    shutil.copytree(release_random_dir, folder)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        (folder / name).unlink()
    with pytest.raises(ModelLoadError, match="no tokenizer in .*tokenizer.json or tokenizer.model"):
        load_model(folder)


def test_a_config_without_a_canvas_length_says_so(tmp_path: Path, release_random_dir: Path) -> None:
    folder = tmp_path / "model"
    shutil.copytree(release_random_dir, folder)
    config = json.loads((folder / "config.json").read_text())
    config["canvas_length"] = None
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelLoadError, match="sets no canvas_length"):
        load_model(folder)


def test_running_out_of_memory_while_loading_gives_the_memory_plan(
    release_random_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The load's own error, then what the plan advises for this checkpoint on this machine (a TypeError in the
    advice once hid both)."""

    def out_of_memory(*args: object, **kwargs: object) -> None:
        raise torch.OutOfMemoryError("CUDA out of memory (injected)")

    monkeypatch.setattr(transformers.DiffusionGemmaForBlockDiffusion, "from_pretrained", out_of_memory)
    with pytest.raises(ModelLoadError, match="out of memory loading .*injected.*; ") as raised:
        load_model(release_random_dir)
    assert "no memory plan" not in str(raised.value), raised.value


def test_a_training_tokenizer_without_fim_tokens_is_refused(release_tokenizer: object) -> None:
    """The release's tokenizer has no FIM sentinels: training examples in the FIM layout cannot be made with it."""
    with pytest.raises(ValueError, match="lacks"):
        ExampleMaker(release_tokenizer, canvas=32)  # type: ignore[arg-type]


def _incomplete_copy(release_random_dir: Path, folder: Path) -> None:
    """The release-format folder as an interrupted copy leaves it: the index, one shard gone, one cut short."""
    shutil.copytree(release_random_dir, folder)
    (folder / "model-00003-of-00006.safetensors").unlink()
    short = folder / "model-00005-of-00006.safetensors"
    short.write_bytes(short.read_bytes()[:100_000])


def test_an_incomplete_folder_is_refused_before_loading_naming_what_is_missing(
    tmp_path: Path, release_random_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "model"
    _incomplete_copy(release_random_dir, folder)
    read: list[str] = []

    def reads(name: str) -> object:
        def refuse(*args: object, **kwargs: object) -> None:
            read.append(name)
            raise AssertionError(f"{name} read an incomplete folder")

        return refuse

    monkeypatch.setattr(transformers.DiffusionGemmaForBlockDiffusion, "from_pretrained", reads("the model"))
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", reads("the tokenizer"))
    with pytest.raises(ModelLoadError, match="incomplete") as raised:
        load_model(folder)
    assert "model-00003-of-00006.safetensors is missing" in str(raised.value)
    assert "model-00005-of-00006.safetensors is 100000 bytes of 300380 bytes (cut short)" in str(raised.value)
    assert read == []


def test_a_folder_with_a_config_and_no_weights_says_so(tmp_path: Path, release_random_dir: Path) -> None:
    folder = tmp_path / "model"
    shutil.copytree(release_random_dir, folder, ignore=shutil.ignore_patterns("*.safetensors*"))
    with pytest.raises(ModelLoadError, match="no weights in .*model.safetensors.index.json and the shards"):
        load_model(folder)


def test_an_index_naming_a_file_outside_the_folder_is_refused(tmp_path: Path, release_random_dir: Path) -> None:
    folder = tmp_path / "model"
    shutil.copytree(release_random_dir, folder)
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    index["weight_map"]["model.decoder.embed_tokens.weight"] = "../elsewhere.safetensors"
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(ModelLoadError, match="a file outside the checkpoint folder"):
        load_model(folder)


@pytest.mark.parametrize(
    ("key", "value", "named"),
    [
        ("max_denoising_steps", 1_000_000, "max_denoising_steps"),  # the red team's: ready, then every request refused
        ("stability_threshold", 1_000_000, "stability_threshold"),
        ("eos_token_id", [1, 106, 50_000], "eos_token_id"),  # the red team's: every rewrite an internal IndexError
        ("pad_token_id", 1 << 20, "pad_token_id"),
        ("t_max", 1e9, "t_max"),
        (
            "sampler_config",
            {"_cls_name": "EntropyBoundSamplerConfig", "entropy_bound": float("inf")},
            "sampler_config.entropy_bound",
        ),
    ],
)
def test_the_models_own_sampler_settings_and_ids_are_checked_at_load(
    tmp_path: Path, release_random_dir: Path, key: str, value: object, named: str
) -> None:
    """A setting the engine cannot serve, or an id outside the vocabulary, is a failed load naming the key, not a
    model that loads as ready and then refuses or fails every request."""
    folder = tmp_path / "model"
    shutil.copytree(release_random_dir, folder)
    generation = json.loads((folder / "generation_config.json").read_text())
    generation[key] = value
    (folder / "generation_config.json").write_text(json.dumps(generation))
    with pytest.raises(ModelLoadError, match=f"generation_config.json: {named}"):
        load_model(folder)


def _index(folder: Path, names: list[str]) -> None:
    weight_map = {f"tensor{number}": name for number, name in enumerate(names)}
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))


def test_the_shard_check_stays_in_the_folder_quotes_no_bytes_and_names_ten_problems(tmp_path: Path) -> None:
    """Issue 42, finding 10: the shard check followed a linked folder out of the checkpoint, quoted the first bytes
    of a file it read (as a header length), failed on a deeply nested header with a bare RecursionError, and named
    10,000 missing shards in one message."""
    from diffgemma_engine.loading import shards

    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.safetensors").write_bytes(b"TOPSECRETVALUE!!" * 4)
    folder = tmp_path / "checkpoint"
    folder.mkdir()
    (folder / "linked").symlink_to(outside)
    (folder / "a.safetensors").write_bytes(b"\xff" * 8 + b"{}")  # a length that is the file's first bytes
    deep = b"[" * 200_000 + b"]" * 200_000
    (folder / "b.safetensors").write_bytes(len(deep).to_bytes(8, "little") + deep)
    _index(folder, ["linked/secret.safetensors", "a.safetensors", "b.safetensors"])
    first, second, third = shards.problems(folder)  # in name order
    assert str(int.from_bytes(b"\xff" * 8, "little")) not in first and first.startswith("a.safetensors")
    assert second.endswith("its header is nested too deep to be a safetensors header")
    assert third == "linked/secret.safetensors is in a folder linked outside the checkpoint folder"
    _index(folder, [f"model-{number:05d}.safetensors" for number in range(10_000)])
    with pytest.raises(ModelLoadError) as refused:
        shards.check_complete(folder)
    assert str(refused.value).count("is missing") == shards.MAX_NAMED and "and 9990 more" in str(refused.value)
