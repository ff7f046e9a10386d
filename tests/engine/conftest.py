"""Fixtures of the engine's tests: the test checkpoints loaded in-process, once per module that asks."""

from __future__ import annotations

from pathlib import Path

import pytest

from diffgemma_engine.loading.model import LoadedModel, load_model


@pytest.fixture(scope="module")
def memorized(memorized_model_dir: Path) -> LoadedModel:
    """The checkpoint that answers ``MEMORIZED_MIDDLE`` between ``MEMORIZED_PREFIX`` and ``MEMORIZED_SUFFIX``."""
    return load_model(memorized_model_dir)


@pytest.fixture(scope="module")
def random_weights(random_model_dir: Path) -> LoadedModel:
    """Random weights of the test size: sure of nothing, so they never settle."""
    return load_model(random_model_dir)
