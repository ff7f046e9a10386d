"""A model folder chosen by a repository or a typo is read with limits and refused with a clear reason."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from diffgemma_engine.checkpoint_files import MAX_SETTINGS_FILE_BYTES
from diffgemma_engine.errors import ModelLoadError
from diffgemma_engine.model import load_model


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
