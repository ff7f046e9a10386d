"""The VS Code extension (editors/vscode): its settings are the server's (its build and unit tests run with the
end-to-end tests: ``tests/e2e/test_vscode_build.py``)."""

from __future__ import annotations

import json

import attrs

from diffgemma_lsp.settings import WIRE_KEYS, Settings, parse_settings
from tests.support.npm import EXTENSION

EXTENSION_ONLY = {"serverPath": "diffgemma-lsp", "serverArgs": []}
"""Settings the extension uses itself (the server's command line), with their defaults."""
JSON_TYPES = {
    "bool": "boolean",
    "int": "integer",
    "float": "number",
    "str": "string",
    "str | None": ["string", "null"],
    "int | None": ["integer", "null"],
    "tuple[str, ...]": "array",
}


def _contributed() -> dict[str, dict]:
    package = json.loads((EXTENSION / "package.json").read_text())
    properties = package["contributes"]["configuration"]["properties"]
    assert all(name.startswith("diffgemma.") for name in properties), list(properties)
    return {name.removeprefix("diffgemma."): schema for name, schema in properties.items()}


def test_contributed_settings_are_exactly_the_servers() -> None:
    contributed = _contributed()
    assert set(contributed) == set(WIRE_KEYS) | set(EXTENSION_ONLY)
    defaults = Settings()
    fields = attrs.fields_dict(Settings)
    for key, name in WIRE_KEYS.items():
        schema = contributed[key]
        default = getattr(defaults, name)
        # Compare as JSON, so that True and 1 (or 0 and False) are not taken for each other.
        assert json.dumps(schema["default"]) == json.dumps(default), key
        assert schema["type"] == JSON_TYPES[str(fields[name].type)], key
        assert schema.get("description") or schema.get("markdownDescription"), f"{key} has no description"
    for key, default in EXTENSION_ONLY.items():
        assert contributed[key]["default"] == default, key
        assert contributed[key].get("description") or contributed[key].get("markdownDescription"), key
    for key in WIRE_KEYS:
        # A setting offered as a list of choices: the server takes each choice, and refuses others.
        if choices := contributed[key].get("enum"):
            for choice in choices:
                assert parse_settings({key: choice})[1] == [], (key, choice)
            assert parse_settings({key: "not-a-choice"})[1], f"the server takes any {key}: drop the enum"
    # What the extension sends by default is what the server takes without a complaint.
    sent = {key: contributed[key]["default"] for key in WIRE_KEYS}
    assert parse_settings({"diffgemma": sent}) == (defaults, [])


def test_a_repository_cannot_choose_where_code_goes_or_what_loads() -> None:
    """Settings that send code or a secret elsewhere, or pick what the engine loads, are the user's own: machine
    scope (never from a workspace's .vscode/settings.json) and restricted in untrusted workspaces."""
    package = json.loads((EXTENSION / "package.json").read_text())
    restricted = set(package["capabilities"]["untrustedWorkspaces"]["restrictedConfigurations"])
    contributed = _contributed()
    for key in ("model", "backend", "openaiUrl", "openaiModel", "openaiApiKeyEnv"):
        assert contributed[key].get("scope") == "machine", key
        assert f"diffgemma.{key}" in restricted, key
    assert {"diffgemma.serverPath", "diffgemma.serverArgs"} <= restricted
    assert "/tmp/" not in json.dumps(package)  # no example path another user could own
