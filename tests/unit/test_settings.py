"""Settings: camelCase keys, bad values reported and replaced by defaults, README in sync."""

from __future__ import annotations

import re
from pathlib import Path

from diffgemma_lsp.settings import WIRE_KEYS, Settings, parse_settings

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
