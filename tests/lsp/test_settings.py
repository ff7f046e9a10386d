"""Settings: camelCase keys, bad values reported and replaced by defaults, README in sync."""

from __future__ import annotations

import re
from pathlib import Path

import attrs
import pytest

from diffgemma_engine.shared.socket_paths import default_socket_path, socket_path_for
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


def test_an_empty_list_means_defaults() -> None:
    """Lua has one table type: an empty one (the Neovim README's ``settings = {}``, with every line commented
    out) is encoded as a JSON array. Before: "settings must be an object, got list" on every start."""
    assert parse_settings([]) == (Settings(), [])
    assert parse_settings({"diffgemma": []}) == (Settings(), [])
    assert parse_settings({"diffgemma": [1]})[1] == ["settings must be an object, got list"]


def test_readme_documents_every_setting() -> None:
    documented = set(re.findall(r"^\| `(\w+)` \|", README.read_text(), flags=re.MULTILINE))
    assert documented >= set(WIRE_KEYS), f"undocumented: {set(WIRE_KEYS) - documented}"


def test_each_model_and_device_has_its_own_engine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    assert socket_path_for(None) == default_socket_path()
    one, two = socket_path_for(str(tmp_path / "a")), socket_path_for(str(tmp_path / "b"))
    assert len({default_socket_path(), one, two, socket_path_for(str(tmp_path / "a"), "cpu")}) == 4
    assert socket_path_for(str(tmp_path / "x" / ".." / "a")) == one  # the same folder, however it is spelled
    assert socket_path_for(str(tmp_path / "a"), "auto", "int8") not in (one, two)  # quantized: another engine
    assert socket_path_for(None, "auto", "int8") != default_socket_path()
    base = Settings()
    assert base.backend_key() != attrs.evolve(base, model="/m").backend_key()
    assert base.backend_key() != attrs.evolve(base, quantization="int8").backend_key()
    assert base.backend_key() == attrs.evolve(base, debounce_ms=5).backend_key()


def test_settings_cannot_send_another_secret_or_use_another_scheme() -> None:
    settings, problems = parse_settings(
        {"openaiApiKeyEnv": "AWS_SECRET_ACCESS_KEY", "openaiUrl": "file:///etc/passwd", "backend": "openai"}
    )
    assert settings.openai_api_key_env == "DIFFGEMMA_API_KEY" and settings.openai_url == ""
    assert any("openaiApiKeyEnv" in problem for problem in problems)
    assert any("openaiUrl" in problem and "http" in problem for problem in problems)
    settings, problems = parse_settings({"openaiApiKeyEnv": "VLLM_API_KEY", "openaiUrl": "https://gpu:8000/v1"})
    assert problems == [] and settings.openai_api_key_env == "VLLM_API_KEY"
    assert parse_settings({"openaiApiKeyEnv": ""})[1] == []  # no key at all


def test_plain_http_to_another_machine_is_told_apart() -> None:
    from diffgemma_engine.shared.urls import plain_http_elsewhere

    assert plain_http_elsewhere("http://gpu-box:8000/v1/completions")
    assert plain_http_elsewhere("http://10.0.0.5/v1/completions")
    for url in ("https://gpu-box/v1", "http://127.0.0.1:8790/v1", "http://localhost/v1", "http://[::1]:8/v1"):
        assert not plain_http_elsewhere(url), url


def test_limits_the_engine_would_refuse_are_reported_here() -> None:
    from diffgemma_engine.request.infill import MAX_CANVAS_LENGTH, MAX_STEPS

    settings, problems = parse_settings(
        {"canvasLength": MAX_CANVAS_LENGTH + 1, "steps": MAX_STEPS + 1, "contextTokens": 10**9, "debounceMs": 5}
    )
    assert (settings.canvas_length, settings.steps, settings.context_tokens) == (0, 0, 1024)
    assert settings.debounce_ms == 5
    assert len(problems) == 3 and all("at most" in problem for problem in problems), problems
    assert parse_settings({"canvasLength": MAX_CANVAS_LENGTH, "steps": MAX_STEPS})[1] == []


def test_the_quantization_setting_reaches_the_engines_command_line(tmp_path: Path) -> None:
    from diffgemma_lsp.backends.connect import EngineSettings, engine_command

    command = engine_command(tmp_path / "e.sock", EngineSettings(device="cuda:0", quantization="int8"))
    assert command[command.index("--quantization") + 1] == "int8"
    assert "--quantization" not in engine_command(tmp_path / "e.sock", EngineSettings())
    settings, problems = parse_settings({"quantization": "int4"})
    assert settings.quantization == "" and problems and "quantization" in problems[0]


def test_rewrite_settings_a_share_and_a_step_count() -> None:
    settings, problems = parse_settings({"rewriteEnabled": False, "rewriteStrength": 0.25, "rewriteSteps": 8})
    assert problems == []
    assert (settings.rewrite_enabled, settings.rewrite_strength, settings.rewrite_steps) == (False, 0.25, 8)
    defaults = Settings()
    assert (defaults.rewrite_enabled, defaults.rewrite_strength, defaults.rewrite_steps) == (True, 0.6, 0)
    whole, problems = parse_settings({"rewriteStrength": 1})  # JSON has one number type: 1 is 1.0
    assert problems == [] and whole.rewrite_strength == 1.0 and isinstance(whole.rewrite_strength, float)


@pytest.mark.parametrize("value", [0, 0.0, -0.5, 1.01, float("nan"), float("inf"), True, "0.5", None])
def test_a_strength_outside_the_share_is_reported_and_the_default_used(value: object) -> None:
    settings, problems = parse_settings({"rewriteStrength": value, "rewriteSteps": 4})
    assert settings.rewrite_strength == 0.6 and settings.rewrite_steps == 4  # the other key keeps its value
    assert len(problems) == 1 and "rewriteStrength" in problems[0] and "0.6" in problems[0], problems


def test_rewrite_steps_have_the_engines_limit() -> None:
    from diffgemma_engine.request.infill import MAX_STEPS

    settings, problems = parse_settings({"rewriteSteps": MAX_STEPS + 1, "rewriteEnabled": "yes"})
    assert (settings.rewrite_steps, settings.rewrite_enabled) == (0, True)
    assert len(problems) == 2 and any("at most" in problem for problem in problems)


HUB_ID = "google/diffusiongemma-26B-A4B-it"


def test_a_hub_id_is_a_model_the_engine_is_started_with(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from diffgemma_lsp.backends.connect import EngineSettings, engine_command

    monkeypatch.chdir(tmp_path)
    settings, problems = parse_settings({"model": HUB_ID})
    assert (settings.model, problems) == (HUB_ID, [])
    command = engine_command(tmp_path / "engine.sock", EngineSettings.of(settings))
    assert command[command.index("--model") + 1] == HUB_ID


def test_a_hub_id_has_one_engine_whatever_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Windows opened in different folders share the engine of a hub id (a folder's path was resolved against
    the working directory, so each folder got its own engine, each loading the model)."""
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    sockets = set()
    for folder in ("one", "two"):
        (tmp_path / folder).mkdir()
        monkeypatch.chdir(tmp_path / folder)
        sockets.add(socket_path_for(HUB_ID))
    assert len(sockets) == 1
    (tmp_path / "two" / "google" / "diffusiongemma-26B-A4B-it").mkdir(parents=True)  # a folder of that name wins
    assert socket_path_for(HUB_ID) not in sockets


@pytest.mark.parametrize("model", ["diffusiongemma", "google/", "google diffusiongemma", "a/b/c", "org/../x"])
def test_a_model_that_is_neither_a_folder_nor_a_hub_id_is_named(
    model: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    settings, problems = parse_settings({"model": model})
    assert settings.model is None
    assert len(problems) == 1 and "a checkpoint folder or a hub id (owner/name" in problems[0], problems
    (tmp_path / "diffusiongemma").mkdir()
    assert parse_settings({"model": "diffusiongemma"}) == (Settings(model="diffusiongemma"), [])


def test_the_runtime_and_step_settings_reach_the_engines_command_line_and_name_its_engine(tmp_path: Path) -> None:
    """``runtime`` and ``vllmCommand`` start the engine with ``--runtime`` and ``--vllm-command``; each value has
    its own engine (a changed setting reaches one that serves it); a relative vllm path is refused."""
    from diffgemma_lsp.backends.connect import EngineSettings, engine_command

    settings, problems = parse_settings({"runtime": "vllm", "vllmCommand": "/opt/vllm/bin/vllm", "stepMode": "eager"})
    assert problems == []
    command = engine_command(tmp_path / "e.sock", EngineSettings.of(settings))
    assert command[command.index("--runtime") + 1] == "vllm"
    assert command[command.index("--vllm-command") + 1] == "/opt/vllm/bin/vllm"
    assert command[command.index("--step") + 1] == "eager"
    default = engine_command(tmp_path / "e.sock", EngineSettings.of(Settings()))
    assert (default[default.index("--runtime") + 1], default[default.index("--step") + 1]) == ("auto", "auto")
    assert "--vllm-command" not in default
    raws: list[dict[str, object]] = [
        {},
        {"runtime": "transformers"},
        {"runtime": "vllm"},
        {"vllmCommand": "/opt/vllm/bin/vllm"},
        {"stepMode": "captured"},
    ]
    sockets = {EngineSettings.of(parse_settings(raw)[0]).socket_path() for raw in raws}
    assert len(sockets) == 5 and default_socket_path() in sockets  # the defaults keep the default engine
    refused, problems = parse_settings({"runtime": "tensorrt", "vllmCommand": "venv/bin/vllm", "stepMode": "fast"})
    assert (refused.runtime, refused.vllm_command, refused.step_mode) == ("auto", "", "auto")
    assert len(problems) == 3 and any("absolute path" in problem for problem in problems), problems


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("deadlineMs", 3_600_001),  # past the wire's bound: every completion failed with a traceback in the reply
        ("debounceMs", 10**30),  # automatic completions were never answered
        ("engineIdleExitMinutes", 10**30),
    ],
)
def test_a_value_past_the_wires_bound_is_refused_with_the_settings_name(key: str, value: int) -> None:
    """Issue 42, finding 8: settings the wire refuses were accepted."""
    settings, problems = parse_settings({key: value})
    assert settings == Settings()
    assert len(problems) == 1 and f"setting {key!r}" in problems[0] and "at most" in problems[0], problems
