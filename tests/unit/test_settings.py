"""Settings: camelCase keys, bad values reported and replaced by defaults, README in sync."""

from __future__ import annotations

import re
from pathlib import Path

import attrs
import pytest

from diffgemma_lsp.settings import WIRE_KEYS, Settings, parse_settings
from engine.protocol import default_socket_path, socket_path_for

README = Path(__file__).resolve().parents[2] / "README.md"


def test_nested_or_flat_camel_case() -> None:
    flat, problems = parse_settings({"canvasLength": 64, "debounceMs": 10, "model": "/m"})
    nested, _ = parse_settings({"diffgemma": {"canvasLength": 64, "debounceMs": 10, "model": "/m"}})
    assert flat == nested == Settings(canvas_length=64, debounce_ms=10, model="/m")
    assert problems == []


def test_bad_values_fall_back_to_defaults_and_are_named() -> None:
    settings, problems = parse_settings({"canvasLength": "long", "steps": -3, "enable": 1, "deadlineMs": 5})
    assert settings == Settings(deadline_ms=5)
    assert len(problems) == 3
    assert any("canvasLength" in p for p in problems)
    assert any("steps" in p and "0 or more" in p for p in problems)
    assert any("enable" in p for p in problems)


def test_unknown_keys_and_non_objects_are_reported() -> None:
    assert "unknown setting 'colour'" in parse_settings({"colour": 1})[1][0]
    settings, problems = parse_settings([1, 2])
    assert settings == Settings() and problems


def test_none_means_defaults() -> None:
    assert parse_settings(None) == (Settings(), [])


def test_readme_documents_every_setting() -> None:
    documented = set(re.findall(r"^\| `(\w+)` \|", README.read_text(), flags=re.MULTILINE))
    assert documented >= set(WIRE_KEYS), f"undocumented: {set(WIRE_KEYS) - documented}"


def test_each_model_and_device_has_its_own_engine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    assert socket_path_for(None) == default_socket_path()
    one, two = socket_path_for(str(tmp_path / "a")), socket_path_for(str(tmp_path / "b"))
    assert len({default_socket_path(), one, two, socket_path_for(str(tmp_path / "a"), "cpu")}) == 4
    assert socket_path_for(str(tmp_path / "x" / ".." / "a")) == one  # the same folder, however it is spelled
    base = Settings()
    assert base.backend_key() != attrs.evolve(base, model="/m").backend_key()
    assert base.backend_key() == attrs.evolve(base, debounce_ms=5).backend_key()
