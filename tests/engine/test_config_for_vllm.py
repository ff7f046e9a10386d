"""Issue 41: vLLM could not start on the shipped model nor on any checkpoint the project's training writes
(``'Gemma4VisionConfig' object has no attribute 'default_output_length'``: vLLM's Gemma 4 multimodal code reads it
unconditionally, and transformers' vision config does not declare it). Every config the project writes has every
key the release's config has (tests/data/release/config.json is the release's), with the values that make vLLM
run the checkpoint as transformers does; vLLM's own loader (its ``ModelConfig``) reads them."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from transformers import DiffusionGemmaConfig, DiffusionGemmaForBlockDiffusion

from diffgemma_engine.loading.checkpoint_files import DEFAULT_MODEL_DIR
from diffgemma_engine.training.configs import RELEASE_IMAGE_TOKENS, SIZES, build_config, save_checkpoint
from tests.support.release_format import RELEASE
from tests.support.vllm_env import VllmChecker

PARTS = (None, "text_config", "vision_config")
"""The config's top level and the two sub-configs vLLM's Gemma 4 code reads."""


def _missing(written: dict[str, Any]) -> dict[str, set[str]]:
    """The keys of the release's config (per part) that ``written`` lacks."""
    release = json.loads((RELEASE / "config.json").read_text())
    missing = {}
    for part in PARTS:
        theirs, ours = (release, written) if part is None else (release[part], written.get(part, {}))
        if lacking := set(theirs) - set(ours):
            missing[part or "top"] = lacking
    return missing


def _saved(model: DiffusionGemmaForBlockDiffusion, folder: Path) -> dict[str, Any]:
    save_checkpoint(model, DEFAULT_MODEL_DIR, folder)  # the training's writer (train.py, export.py, test models)
    written: dict[str, Any] = json.loads((folder / "config.json").read_text())
    return written


def test_the_shipped_config_has_every_key_of_the_releases() -> None:
    shipped = json.loads((DEFAULT_MODEL_DIR / "config.json").read_text())
    assert _missing(shipped) == {}
    assert shipped["vision_config"]["default_output_length"] == RELEASE_IMAGE_TOKENS
    assert shipped["text_config"]["final_logit_softcapping"] == 30.0  # what transformers applies to its logits


@pytest.mark.parametrize("size", sorted(SIZES))
def test_every_size_the_training_writes_has_every_key_of_the_releases(size: str) -> None:
    config = build_config(size, 512, canvas_length=16)
    assert _missing(config.to_dict()) == {}


def test_a_checkpoint_written_again_from_an_older_folder_gets_what_it_lacked(tmp_path: Path) -> None:
    """``export.py`` and ``train.py --init`` read a folder the training wrote before (without these keys) and write
    it again through ``save_checkpoint``: what it lacked is added, what it had is kept."""
    older = build_config("test", 512, canvas_length=16).to_dict()
    del older["vision_config"]["default_output_length"], older["text_config"]["final_logit_softcapping"]
    del older["eos_token_id"]
    assert set(_missing(older)) == {"top", "text_config", "vision_config"}  # the check can fail
    older["text_config"]["eos_token_id"] = 1
    model = DiffusionGemmaForBlockDiffusion(DiffusionGemmaConfig.from_dict(older)).eval()
    written = _saved(model, tmp_path / "again")
    assert _missing(written) == {}
    assert written["eos_token_id"] == [1]
    assert written["text_config"]["final_logit_softcapping"] == model.config.text_config.final_logit_softcapping


@pytest.fixture(scope="module")
def vllm(vllm_python: Path) -> Iterator[VllmChecker]:
    checker = VllmChecker(vllm_python)
    yield checker
    checker.close()


def test_vllm_reads_what_its_gemma4_code_needs_from_the_shipped_and_a_trained_checkpoint(
    vllm: VllmChecker, tmp_path: Path
) -> None:
    model = DiffusionGemmaForBlockDiffusion(build_config("test", 8192, canvas_length=16)).eval()
    for folder in (DEFAULT_MODEL_DIR, tmp_path / "trained"):
        if folder != DEFAULT_MODEL_DIR:
            _saved(model, folder)
        assert vllm.served_config(folder) == {
            "default_output_length": RELEASE_IMAGE_TOKENS,
            "final_logit_softcapping": 30.0,
            "is_diffusion": True,
        }
